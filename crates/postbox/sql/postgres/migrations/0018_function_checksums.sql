-- The functions of sql/postgres/functions/ installed in this schema, with the checksum (SHA-256)
-- of the file each came from: `postbox migrate` installs a function again (CREATE OR REPLACE)
-- only when its file changed, so a function lives in one file instead of one migration per
-- change. Functions defined by earlier migrations are installed once more from their files on
-- the first migrate that has this table.
CREATE TABLE {schema}.postbox_functions (
    name VARCHAR(255) PRIMARY KEY,
    checksum CHAR(64) NOT NULL,
    installed_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
