// One row into bench_rows per run, carrying the job's id, through
// `helpers.query`: the pool graphile-worker lends its tasks, which is how its
// documentation has a task reach the database. The insert commits on its own,
// before graphile-worker records the completion (as with the other peers).
module.exports = async (_payload, helpers) => {
  await helpers.query("INSERT INTO bench_rows (job_id) VALUES ($1)", [helpers.job.id]);
};
