// The benchmark's no-op job: returns at once, so a drain measures the queue
// itself (claim, dispatch, completion), as the peers' `noop` tasks do.
module.exports = () => {};
