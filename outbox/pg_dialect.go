package outbox

import "fmt"

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

// PostgresText declares, for a statement a processor runs by its SQLite
// text (Tx.Exec, Get, Select, Stmt, ReadStmt), the text a PostgreSQL
// store runs in its place, with placeholders written as for SQLite (?,
// ?N). A processor whose SQL is the same on both engines declares
// nothing. Call it from an init function (the texts are read without a
// lock); it panics when sqlite already has another PostgreSQL text.
func PostgresText(sqlite, pg string) {
	if was, ok := pgDialect[sqlite]; ok && was != pg {
		panic(fmt.Sprintf("outbox: PostgresText: %q has a PostgreSQL text already", firstLine(sqlite)))
	}
	pgDialect[sqlite] = pg
}

// chunksAfterPGQuery is chunksAfterQuery on PostgreSQL, bounded to the
// chunks that hold the next ?2 ids: SQLite steps its cursor only as far
// as the rows read, but PostgreSQL sends every row of a query, and pgx
// reads them all before a Close returns, so the unbounded query read the
// whole outbox at each relay batch (34,988 records/s in server bench's
// relay phase at 500,000 lines). The window starts at the first chunk
// after ?1 (an id range the outbox no longer holds, dead-lettered rows,
// is skipped), so a read returns at least one chunk when there is one.
const chunksAfterPGQuery = `SELECT last_id, count, feed, partition, epoch, topic, created_at, body
FROM outbox_chunks WHERE last_id > ?1 AND last_id - count < GREATEST(?1,
(SELECT c.last_id - c.count FROM outbox_chunks AS c WHERE c.last_id > ?1 ORDER BY c.last_id LIMIT 1)) + ?2
ORDER BY last_id`
