-- outboxd's whole SQLite schema.
--
-- The file is a list of migrations. Each starts with a line "-- migration: N"
-- (N = 1, 2, 3, ... in order) and is applied once, in one transaction that also
-- sets PRAGMA user_version = N. Never edit a migration that has shipped: add a
-- new one below it.

-- migration: 1

-- Settings the store generates once and keeps (the relay's id, ...).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

-- One row per feed: its description and counters. Counters are written in
-- the same transaction as the items they count.
CREATE TABLE feeds (
    name                TEXT PRIMARY KEY,
    kind                TEXT NOT NULL DEFAULT '',
    source              TEXT NOT NULL DEFAULT '',
    processor           TEXT NOT NULL DEFAULT '',
    applied             INTEGER NOT NULL DEFAULT 0,
    replays_skipped     INTEGER NOT NULL DEFAULT 0,
    retries             INTEGER NOT NULL DEFAULT 0,
    dead_lettered       INTEGER NOT NULL DEFAULT 0,
    completion_failures INTEGER NOT NULL DEFAULT 0,
    epoch_changes       INTEGER NOT NULL DEFAULT 0,
    lossless            INTEGER NOT NULL DEFAULT 1,
    last_applied_at     INTEGER NOT NULL DEFAULT 0, -- unix nanoseconds, 0 = never
    last_error          TEXT NOT NULL DEFAULT ''
) STRICT;

-- The authority on what was applied: per feed and partition, the source's
-- epoch and the position after the last item whose effects are in the state.
-- "source_end" is the source's end as last seen (file size, high watermark).
CREATE TABLE positions (
    feed       TEXT NOT NULL REFERENCES feeds(name),
    partition  INTEGER NOT NULL,
    epoch      TEXT NOT NULL,
    position   INTEGER NOT NULL,
    source_end INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (feed, partition)
) STRICT, WITHOUT ROWID;

-- Output rows, published by the relay in id order. AUTOINCREMENT: an id is
-- never reused, even after the rows below it are pruned.
CREATE TABLE outbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    feed       TEXT NOT NULL,
    partition  INTEGER NOT NULL,
    epoch      TEXT NOT NULL,
    position   INTEGER NOT NULL,
    n          INTEGER NOT NULL, -- the output's index among its item's outputs
    topic      TEXT NOT NULL,
    key        BLOB,
    value      BLOB,
    headers    BLOB,             -- encoded by outbox.EncodeHeaders, NULL when none
    created_at INTEGER NOT NULL  -- unix nanoseconds
) STRICT;
CREATE INDEX outbox_feed ON outbox (feed, id);

-- Items no processor could apply, kept whole.
CREATE TABLE dead_letters (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    feed        TEXT NOT NULL REFERENCES feeds(name),
    partition   INTEGER NOT NULL,
    epoch       TEXT NOT NULL,
    position    INTEGER NOT NULL,
    sequence    INTEGER NOT NULL,
    attempts    INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    error       TEXT NOT NULL,
    key         BLOB,
    payload     BLOB,
    headers     BLOB,
    at          INTEGER NOT NULL,
    requeued_at INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX dead_letters_feed ON dead_letters (feed, id);

-- Input a feed moved past without its effects being kept: skipped completion
-- failures, file bytes truncated or rotated away unread, Kafka offsets deleted
-- by retention. A loss stays; acking it only clears the feed's lossless flag.
CREATE TABLE losses (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    feed      TEXT NOT NULL REFERENCES feeds(name),
    partition INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    reason    TEXT NOT NULL,
    epoch     TEXT NOT NULL,
    from_pos  INTEGER NOT NULL,
    to_pos    INTEGER NOT NULL,
    acked_at  INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX losses_feed ON losses (feed, id);

-- The relay's progress: the last outbox id it published.
CREATE TABLE relay_progress (
    relay_id   TEXT PRIMARY KEY,
    last_id    INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

-- State of the built-in ledger processor.
CREATE TABLE ledger_balances (
    feed    TEXT NOT NULL,
    account TEXT NOT NULL,
    balance INTEGER NOT NULL,
    lines   INTEGER NOT NULL,
    PRIMARY KEY (feed, account)
) STRICT, WITHOUT ROWID;

-- migration: 2

-- Outbox rows are written at the ingest rate; an index on (feed, id) cost
-- each of them about a tenth of the ingest CPU. A feed's backlog is counted
-- over the pending rows instead (Store.Backlog), found by id.
DROP INDEX IF EXISTS outbox_feed;

-- migration: 3

-- An output the relay cannot publish (too large for Kafka) becomes a dead
-- letter of its feed, naming its outbox row and the topic it was for. There
-- is one per row: the relay stores it before the Kafka transaction that
-- passes the row commits, and storing it again after a crash changes
-- nothing. An item's dead letter has neither (NULL and '').
ALTER TABLE dead_letters ADD COLUMN outbox_id INTEGER;
ALTER TABLE dead_letters ADD COLUMN topic TEXT NOT NULL DEFAULT '';
CREATE UNIQUE INDEX dead_letters_outbox_id ON dead_letters (outbox_id);

-- migration: 4

-- The metrics count a feed's dead letters by reason at every scrape; the
-- index lets SQLite count them without reading the rows (payloads).
CREATE INDEX dead_letters_reason ON dead_letters (feed, reason);

-- migration: 5

-- Outputs are stored packed (outbox/chunk.go): a chunk holds a run of an
-- ingest transaction's outputs that share feed, partition, epoch and
-- topic, at most 64, with consecutive ids ending at last_id. Its body holds
-- what differs between them (position, n, key, value, headers), output
-- after output, LZ4-compressed when that saves a tenth. SQLite's work per
-- row is then paid once per chunk, and the shared texts are stored once:
-- writing short outputs costs SQLite a tenth of a row each. position is the
-- least position of its outputs (a replay's diff reads outputs in place
-- order); bytes is what the chunk counts in the backlog, about what it
-- takes on disk.
CREATE TABLE outbox_chunks (
    last_id    INTEGER PRIMARY KEY,
    count      INTEGER NOT NULL,
    position   INTEGER NOT NULL,
    feed       TEXT NOT NULL,
    partition  INTEGER NOT NULL,
    epoch      TEXT NOT NULL,
    topic      TEXT NOT NULL,
    created_at INTEGER NOT NULL, -- unix nanoseconds
    bytes      INTEGER NOT NULL,
    body       BLOB NOT NULL
) STRICT;

-- The largest output id ever assigned, pruned outputs included: an id is
-- never reused.
CREATE TABLE outbox_ids (last_id INTEGER NOT NULL) STRICT;
INSERT INTO outbox_ids SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0);

-- Each output of an outbox written before becomes a chunk of its own.
INSERT INTO outbox_chunks (last_id, count, position, feed, partition, epoch, topic, created_at, bytes, body)
SELECT id, 1, position, feed, partition, epoch, topic, created_at,
       length(body) + length(feed) + length(epoch) + length(topic) + 48, body
FROM (SELECT *, outbox_output(position, n, key, value, headers) AS body FROM outbox) ORDER BY id;
DROP TABLE outbox;
DELETE FROM sqlite_sequence WHERE name = 'outbox';

-- One row per output, as the table of that name had, for SQL that reads
-- the outbox (state queries, SQL processors). It decodes the bodies with
-- the outbox_field function, which outboxd registers: other SQLite clients
-- read outbox_chunks. outbox_slots numbers a chunk's outputs.
CREATE TABLE outbox_slots (i INTEGER PRIMARY KEY) STRICT;
WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i < 63)
INSERT INTO outbox_slots SELECT i FROM k;
CREATE VIEW outbox (id, feed, partition, epoch, position, n, topic, key, value, headers, created_at) AS
SELECT c.last_id - c.count + 1 + s.i, c.feed, c.partition, c.epoch,
       outbox_field(c.body, s.i, 0), outbox_field(c.body, s.i, 1), c.topic,
       outbox_field(c.body, s.i, 2), outbox_field(c.body, s.i, 3), outbox_field(c.body, s.i, 4),
       c.created_at
FROM outbox_chunks AS c JOIN outbox_slots AS s ON s.i < c.count;

-- migration: 6

-- The processor that made each feed's state: its kind (a built-in's or a
-- registered processor's name, or sql) and a fingerprint of what of its
-- configuration gives the state its meaning (a SQL processor's statements),
-- so that a start with another processor is refused instead of keeping
-- the feed's position and starting its state over. how says how it came
-- to be recorded: new (the feed's first start), adopted (a database from
-- before this table), restart or keep (an operator's choice).
CREATE TABLE feed_processors (
    feed        TEXT PRIMARY KEY REFERENCES feeds(name),
    kind        TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    how         TEXT NOT NULL,
    at          INTEGER NOT NULL -- unix nanoseconds
) STRICT;

-- migration: 7

-- An operator resolves a dead letter: requeues it (applied again, with its
-- payload or an edited one, kept in requeued_payload) or discards it
-- (discarded_at). Either way the dead letter stays stored, with who did it
-- (the API token's name) and why (resolution_note).
ALTER TABLE dead_letters ADD COLUMN discarded_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dead_letters ADD COLUMN resolved_by TEXT NOT NULL DEFAULT '';
ALTER TABLE dead_letters ADD COLUMN resolution_note TEXT NOT NULL DEFAULT '';
ALTER TABLE dead_letters ADD COLUMN requeued_payload BLOB;
-- The dead letters no one resolved yet, by time: the status counts those
-- of the last hour from the index alone.
CREATE INDEX dead_letters_open ON dead_letters (feed, at) WHERE requeued_at = 0 AND discarded_at = 0;

-- Who acknowledged a loss (the API token's name), and why.
ALTER TABLE losses ADD COLUMN acked_by TEXT NOT NULL DEFAULT '';
ALTER TABLE losses ADD COLUMN ack_reason TEXT NOT NULL DEFAULT '';

-- migration: 8

-- Each sink's progress (see sink.Runner): the last outbox id it delivered,
-- or passed over as none of its topics. Apart from relay_progress, whose
-- largest id is the Kafka relay's resume point and the backlog's start.
CREATE TABLE sink_progress (
    sink       TEXT PRIMARY KEY,
    last_id    INTEGER NOT NULL,
    updated_at INTEGER NOT NULL -- unix nanoseconds
) STRICT;

-- migration: 9

-- The migrations of each SQL processor that ran, each once, in the
-- transaction that records it: its version and the SHA-256 of its SQL, so
-- that a migration whose SQL changed after it ran, or a configuration older
-- than the database, is refused at start.
CREATE TABLE processor_migrations (
    processor TEXT NOT NULL,
    version   INTEGER NOT NULL,
    sha256    TEXT NOT NULL,
    at        INTEGER NOT NULL, -- unix nanoseconds
    PRIMARY KEY (processor, version)
) STRICT;

-- A windowed SQL processor's event time: the largest seen (its watermark is
-- this less the allowed lateness) and the late items it counted, written in
-- the transaction of the item that moved it, with the feed's position.
CREATE TABLE processor_watermarks (
    processor      TEXT PRIMARY KEY,
    max_event_time INTEGER NOT NULL, -- the largest event time seen, Unix seconds
    late           INTEGER NOT NULL DEFAULT 0 -- late items counted (late: count)
) STRICT;

-- migration: 10

-- Many servers on one database (a consumer group feed): each partition of
-- such a feed has an owner epoch, bumped by the server the group assigned
-- it to before it reads the partition's position. Every batch transaction
-- that touches the partition checks, inside itself, that its epoch is still
-- the one its server took, so a server paused or cut off past its turn
-- commits nothing once another owns the partition. owner names the server
-- holding it ('' once it let it go).
CREATE TABLE partition_owners (
    feed       TEXT NOT NULL,
    partition  INTEGER NOT NULL,
    epoch      INTEGER NOT NULL,
    owner      TEXT NOT NULL DEFAULT '',
    claimed_at INTEGER NOT NULL, -- unix nanoseconds
    PRIMARY KEY (feed, partition)
) STRICT, WITHOUT ROWID;

-- Leases (the relay's leader, say): the holder, its term (bumped at every
-- change of holder, never reused) and when the lease ends unless renewed.
CREATE TABLE leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    term       INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, -- unix nanoseconds
    renewed_at INTEGER NOT NULL  -- unix nanoseconds
) STRICT;

-- The servers sharing the database, as each last said it was alive: its
-- id, its API's address, when it started and when it was last seen.
CREATE TABLE cluster_servers (
    id         TEXT PRIMARY KEY,
    api        TEXT NOT NULL DEFAULT '',
    started_at INTEGER NOT NULL, -- unix nanoseconds
    seen_at    INTEGER NOT NULL  -- unix nanoseconds
) STRICT;
