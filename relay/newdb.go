package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/cenkalti/backoff/v5"

	"github.com/outboxd/outboxd/internal/clock"
	kafkaclient "github.com/outboxd/outboxd/internal/kafka"
)

// ErrNewDatabase is returned by CheckDatabase (wrapped in a
// *NewDatabaseError) when a database that never published finds, on the
// progress topic, that another database at the same path on the same host
// did: the earlier one was deleted or replaced, and this one would publish
// all its outputs again, under another transactional id that no fencing
// stops. An operator must choose: restore the earlier database, or start
// this one afresh on purpose (Config.NewDatabase).
var ErrNewDatabase = errors.New("a new database where an earlier one published")

// NewDatabaseError describes the earlier database CheckDatabase found.
type NewDatabaseError struct {
	Path    string   // the database's absolute path
	Topic   string   // the progress topic
	RelayID string   // the earlier database's relay id
	Last    Progress // its latest progress record
}

// Error says what was found, on one line.
func (e *NewDatabaseError) Error() string {
	at := "at an unknown time"
	if e.Last.At > 0 {
		at = "last at " + time.UnixMilli(e.Last.At).UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("database %s never published, but the progress topic %s shows that another database at this path "+
		"on host %q (relay id %s) published outbox rows up to id %d, %s: it was deleted or replaced since, and publishing "+
		"from this one would repeat those outputs", e.Path, e.Topic, e.Last.Host, e.RelayID, e.Last.LastID, at)
}

// Unwrap returns ErrNewDatabase.
func (e *NewDatabaseError) Unwrap() error { return ErrNewDatabase }

// CheckDatabase keeps a database from publishing again what an earlier
// one at its place published. In exactly-once mode, when the store's
// database has never published (no progress in SQLite, none on the
// progress topic under its relay id), it reads the whole progress topic:
// if the latest record of another relay id names the same database path
// and host, it returns a *NewDatabaseError, unless Config.NewDatabase is
// set now or was on an earlier start of this database. A database that
// has published, a restored backup (same relay id: Run's ErrBackInTime
// check covers it), and databases at other paths or on other hosts pass.
// Kafka failures are retried with backoff until ctx is done, when ctx's
// error is returned. Call it before the process claims the database and
// before Run; not concurrently with Run.
func (r *Relay) CheckDatabase(ctx context.Context) error {
	if r.cfg.Mode != ModeExactlyOnce {
		return nil // only the exactly-once relay keeps progress in Kafka
	}
	if err := r.identify(ctx); err != nil {
		return err
	}
	if sp, err := r.store.RelayProgress(ctx, r.relayID); err != nil || sp > 0 {
		return err
	}
	if at, ok, err := r.store.AcceptedAsNew(ctx); err != nil || ok {
		if ok {
			r.log.Info("this database was started afresh on purpose", "at", at)
		}
		return err
	}
	earlier, err := r.findEarlier(ctx)
	if err != nil || earlier == nil {
		return err
	}
	if !r.cfg.NewDatabase {
		return earlier
	}
	if _, err := r.store.AcceptAsNew(ctx); err != nil {
		return err
	}
	r.log.Warn("starting afresh where an earlier database published: every output of this one is published again",
		"earlier", earlier.Error())
	return nil
}

// findEarlier reads the progress topic, trying again while Kafka fails.
func (r *Relay) findEarlier(ctx context.Context) (*NewDatabaseError, error) {
	bo := &backoff.ExponentialBackOff{
		InitialInterval: r.cfg.MinBackoff, RandomizationFactor: 0.2,
		Multiplier: 2, MaxInterval: r.cfg.MaxBackoff,
	}
	bo.Reset()
	refused := ""
	for {
		earlier, err := r.scanProgress(ctx)
		if err == nil {
			return earlier, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wait := bo.NextBackOff()
		switch {
		case !isUnauthorized(err):
			r.st.failed(StateBackingOff, err) // the status says what the start waits for
			r.log.Warn("cannot read the progress topic to check this new database; trying again", "err", err, "retry_in", wait)
		case err.Error() != refused:
			// An operator must act: ask seldom, say it once.
			refused, wait = err.Error(), r.cfg.UnauthorizedBackoff
			r.st.failed(StateUnauthorized, err)
			r.log.Error("Kafka refused the relay the progress topic it must read to check this new database; asking again every "+
				wait.String(), "err", err)
		default:
			wait = r.cfg.UnauthorizedBackoff
		}
		if err := clock.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// scanProgress reads every partition of the progress topic to its stable
// end and returns the earlier database at this one's place, if any.
func (r *Relay) scanProgress(ctx context.Context) (*NewDatabaseError, error) {
	if err := r.checkAccess(ctx); err != nil {
		return nil, err
	}
	k, err := newKafka(r.cfg.Brokers, r.cfg.Kafka)
	if err != nil {
		return nil, err
	}
	defer k.close()
	parts, err := k.progressPartitions(ctx, r.cfg.ProgressTopic)
	if err != nil {
		return nil, err
	}
	latest := map[string]Progress{}
	for _, pp := range parts {
		if err := k.readLatest(ctx, pp, latest); err != nil {
			return nil, err
		}
	}
	if _, ok := latest[r.relayID]; ok {
		return nil, nil // this database published before: it is no newcomer
	}
	var found *NewDatabaseError
	for id, p := range latest {
		if p.Path != r.dbPath || p.Host != r.host {
			continue
		}
		if found == nil || p.At > found.Last.At {
			found = &NewDatabaseError{Path: r.dbPath, Topic: r.cfg.ProgressTopic, RelayID: id, Last: p}
		}
	}
	return found, nil
}

// progressPartitions lists the partitions of the progress topic; none when
// the topic does not exist (nothing ever published to this cluster).
func (k *kafka) progressPartitions(ctx context.Context, topic string) ([]progressPartition, error) {
	md, err := k.cl.Metadata(ctx, []string{topic}, false)
	if err != nil {
		return nil, fmt.Errorf("progress topic %s: metadata: %w", topic, err)
	}
	td, ok := md[topic]
	if !ok || td.Err == sarama.ErrUnknownTopicOrPartition {
		return nil, nil
	}
	if err := codeErr(td.Err); err != nil {
		return nil, k.denied(fmt.Errorf("progress topic %s: %w", topic, err), ask("Describe", ResourceTopic, topic))
	}
	parts := make([]progressPartition, 0, len(td.Partitions))
	for _, pd := range td.Partitions {
		if err := codeErr(pd.Err); err != nil || pd.Leader < 0 {
			return nil, fmt.Errorf("progress topic %s[%d]: no leader: %w", topic, pd.ID, cmpErr(err, sarama.ErrLeaderNotAvailable))
		}
		parts = append(parts, progressPartition{topic: topic, partition: pd.ID, leader: pd.Leader})
	}
	return parts, nil
}

// readLatest reads a partition's committed records up to its stable end
// into latest, each key's last value winning. A value that does not decode
// is not a relay's progress and is passed over.
func (k *kafka) readLatest(ctx context.Context, pp progressPartition, latest map[string]Progress) error {
	end, err := k.stableEnd(ctx, pp)
	if err != nil {
		return err
	}
	start, err := k.listed(ctx, pp, kafkaclient.Earliest, sarama.ReadUncommitted)
	if err != nil {
		return fmt.Errorf("progress topic %s[%d]: start offset: %w", pp.topic, pp.partition, err)
	}
	return k.fetchRange(ctx, pp, start, end, func(rec kafkaclient.Record) {
		if p, err := DecodeProgress(rec.Value); err == nil {
			latest[string(rec.Key)] = p
		}
	})
}

// stamped adds where and when to a progress record.
func (r *Relay) stamped(p Progress) Progress {
	p.Path, p.Host, p.At = r.dbPath, r.host, r.store.Now().UnixMilli()
	return p
}
