// One graphile-worker process running a no-op task until stopped.
const { run } = require("graphile-worker");

async function main() {
  const runner = await run({
    connectionString: process.env.DATABASE_URL,
    concurrency: Number(process.env.CONCURRENCY || 24),
    noHandleSignals: false,
    pollInterval: 1000,
    taskList: { noop: async () => {} },
    preset: {
      worker: {
        // Batching, as in the figures the targets quote.
        getJobBatchSize: 100,
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
        localQueue: { size: 500 },
      },
    },
  });
  process.on("SIGTERM", () => runner.stop());
  await runner.promise;
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
