package outbox

// pgDialect holds the store's statements whose PostgreSQL text differs
// from SQLite's, keyed by the SQLite text the methods run: pgConn swaps
// them before binding. SQLite's two-argument max and min are GREATEST and
// LEAST; an upsert names the existing row by its table; a sum is numeric
// on PostgreSQL, cast back to BIGINT; the batch's reads of the outbox ids
// and of the claim and the partitions' owner epochs lock their rows (see pg_engine.go).
var pgDialect = map[string]string{
	addStats: `UPDATE feeds SET applied = applied + ?, replays_skipped = replays_skipped + ?,
retries = retries + ?, dead_lettered = dead_lettered + ?, completion_failures = completion_failures + ?,
epoch_changes = epoch_changes + ?, last_applied_at = GREATEST(last_applied_at, ?) WHERE name = ?`,
	setRelayProgressSQL: `INSERT INTO relay_progress (relay_id, last_id, updated_at) VALUES (?, ?, ?)
ON CONFLICT(relay_id) DO UPDATE SET last_id = GREATEST(relay_progress.last_id, excluded.last_id), updated_at = excluded.updated_at`,
	setSinkProgressSQL: `INSERT INTO sink_progress (sink, last_id, updated_at) VALUES (?, ?, ?)
ON CONFLICT(sink) DO UPDATE SET last_id = GREATEST(sink_progress.last_id, excluded.last_id), updated_at = excluded.updated_at`,
	feedBacklogSQL: `SELECT coalesce(sum(LEAST(count, last_id - ?1)), 0)::bigint AS pending,
coalesce(min(created_at), 0) AS oldest_at
FROM outbox_chunks WHERE last_id > ?1 AND last_id <= ?2 AND feed = ?3`,
	claimSQL: `INSERT INTO meta (key, value) VALUES (?, '1')
ON CONFLICT(key) DO UPDATE SET value = (CAST(meta.value AS BIGINT) + 1)::text`,
	lastLossesSQL: `SELECT * FROM
(SELECT * FROM losses WHERE feed = ? ORDER BY id DESC LIMIT ?) AS l ORDER BY id`,
	openDeadLettersSQL: `SELECT count(*) FROM (SELECT 1 FROM dead_letters
WHERE feed = ? AND at >= ? AND requeued_at = 0 AND discarded_at = 0 LIMIT ?) AS d`,
	backlogSQL: `SELECT
GREATEST((SELECT last_id FROM outbox_ids) - ?, 0) AS pending,
coalesce((SELECT created_at FROM outbox_chunks WHERE last_id > ? ORDER BY last_id LIMIT 1), 0) AS oldest_at`,
	deadLetterPreviews: `SELECT id, feed, partition, epoch, position, sequence, attempts, reason,
substr(error, 1, ?1) AS error, length(error) > ?1 AS error_cut,
substr(key, 1, ?1) AS key, substr(payload, 1, ?1) AS payload,
CASE WHEN length(headers) <= ?2 THEN headers END AS headers,
coalesce(length(key), 0) AS key_bytes, coalesce(length(payload), 0) AS payload_bytes,
coalesce(length(headers), 0) AS headers_bytes, at, requeued_at,
discarded_at, resolved_by, substr(resolution_note, 1, ?1) AS resolution_note, requeued_payload IS NOT NULL AS requeue_edited
FROM dead_letters WHERE feed = ?3 AND id > ?4 AND (?6 = '' OR reason = ?6)
AND (NOT ?7::boolean OR (requeued_at = 0 AND discarded_at = 0)) ORDER BY id LIMIT ?5`,
	ownerInTxSQL:          `SELECT value FROM meta WHERE key = ? FOR SHARE`,
	lastIDInTxSQL:         `SELECT last_id FROM outbox_ids FOR UPDATE`,
	partitionEpochInTxSQL: `SELECT epoch FROM partition_owners WHERE feed = ? AND partition = ? FOR SHARE`,
}
