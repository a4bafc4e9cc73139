package outbox

// pgOutboxView is the view outbox on PostgreSQL: one row per output, as
// SQLite's view shows it (schema.sql, migration 5), for SQL that reads the
// outbox (state queries, SQL processors, tests). SQLite's view decodes a
// chunk's body with outbox_field, a function outboxd registers in the
// driver; PostgreSQL runs none of outboxd's code, so outbox_outputs
// decodes a body in PL/pgSQL, and bodies on PostgreSQL are never
// compressed (compressor.never) since PL/pgSQL has no LZ4. A body it
// cannot read (compressed, damaged) raises an error naming its chunk
// rather than showing fewer outputs.
//
// It is no numbered migration: it is made again, CREATE OR REPLACE, at
// every open under the migrations' lock, as outbox_field is registered
// again by every SQLite process, so its text follows the binary's chunk
// format.
const pgOutboxView = `
CREATE OR REPLACE FUNCTION outbox_outputs(body bytea)
RETURNS TABLE (i bigint, "position" bigint, n bigint, key bytea, value bytea, headers bytea)
LANGUAGE plpgsql IMMUTABLE STRICT AS $f$
DECLARE
    p int := 1;
    size int := length(body);
    u bigint;
    s int;
    b int;
    l int;
    f int;
    field bytea;
BEGIN
    IF size = 0 OR get_byte(body, 0) <> 0 THEN
        RAISE EXCEPTION 'outbox chunk body of % bytes is not a raw one (format %): read it through outboxd',
            size, CASE WHEN size > 0 THEN get_byte(body, 0) END;
    END IF;
    i := 0;
    WHILE p < size LOOP
        u := 0; s := 0;
        LOOP
            b := get_byte(body, p); p := p + 1;
            u := u | ((b & 127)::bigint << s); s := s + 7;
            EXIT WHEN b < 128;
        END LOOP;
        "position" := (u >> 1) # (-(u & 1));
        u := 0; s := 0;
        LOOP
            b := get_byte(body, p); p := p + 1;
            u := u | ((b & 127)::bigint << s); s := s + 7;
            EXIT WHEN b < 128;
        END LOOP;
        n := u;
        FOR f IN 1..3 LOOP
            l := 0; s := 0;
            LOOP
                b := get_byte(body, p); p := p + 1;
                l := l | ((b & 127) << s); s := s + 7;
                EXIT WHEN b < 128;
            END LOOP;
            IF l = 0 THEN
                field := NULL;
            ELSE
                field := substring(body FROM p + 1 FOR l - 1);
                p := p + l - 1;
            END IF;
            CASE f WHEN 1 THEN key := field; WHEN 2 THEN value := field; ELSE headers := field; END CASE;
        END LOOP;
        RETURN NEXT;
        i := i + 1;
    END LOOP;
END
$f$;
CREATE OR REPLACE VIEW outbox (id, feed, partition, epoch, "position", n, topic, key, value, headers, created_at) AS
SELECT c.last_id - c.count + 1 + o.i, c.feed, c.partition, c.epoch, o."position", o.n, c.topic,
       o.key, o.value, o.headers, c.created_at
FROM outbox_chunks AS c, LATERAL outbox_outputs(c.body) AS o;
`
