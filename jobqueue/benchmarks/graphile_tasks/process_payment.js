// The seed's process_payment (jobqueue.examples): add the payload's amount to
// the user's balance and record the payment, both or neither. Two statements
// in one transaction need one client: `helpers.withPgClient` lends one from
// graphile-worker's pool, and BEGIN/COMMIT/ROLLBACK on it is node-postgres's
// documented transaction. It commits before graphile-worker records the
// completion (as with the other peers); a payment run again is refused by its
// primary key, so the job fails rather than paying twice.
module.exports = async (payload, helpers) => {
  await helpers.withPgClient(async (client) => {
    await client.query("BEGIN");
    try {
      const credited = await client.query(
        "UPDATE demo_users SET balance = balance + $1 WHERE id = $2 RETURNING balance",
        [payload.amount, payload.user_id],
      );
      if (credited.rowCount !== 1) {
        throw new Error(`no user ${payload.user_id}`);
      }
      await client.query(
        "INSERT INTO demo_payments (payment_id, user_id, amount) VALUES ($1, $2, $3)",
        [payload.payment_id, payload.user_id, payload.amount],
      );
      await client.query("COMMIT");
    } catch (e) {
      await client.query("ROLLBACK");
      throw e;
    }
  });
};
