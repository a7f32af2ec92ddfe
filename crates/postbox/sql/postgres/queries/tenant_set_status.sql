-- Suspends or resumes tenant $1 ($2: ACTIVE or SUSPENDED); no row when there is no such tenant.
UPDATE {schema}.postbox_tenants SET status = $2 WHERE id = $1
RETURNING id, schema_name, status, created_at
