package relay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// checkDatabase runs a new relay's CheckDatabase on the store at path.
func checkDatabase(t *testing.T, path string, cfg Config, adjust func(r *Relay)) error {
	t.Helper()
	r, err := New(outboxtest.StoreAt(t, path), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if adjust != nil {
		adjust(r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return r.CheckDatabase(ctx)
}

// TestRelay_CheckDatabase publishes from a database, deletes it, and checks
// what a relay on a new database at the same place, and at others, says.
func TestRelay_CheckDatabase(t *testing.T) {
	c := newCluster(t)
	brokers := c.ListenAddrs()
	dir := t.TempDir()
	path := filepath.Join(dir, "outboxd.db")
	cfg := testConfig(t, brokers)

	if err := checkDatabase(t, path, cfg, nil); err != nil {
		t.Fatalf("first start ever, no progress topic: %v", err)
	}
	first := outboxtest.StoreAt(t, path)
	ids := emit(t, first, "f", keyed("t", 30, 3, 0)...)
	rr := startRelay(t, first, cfg)
	rr.waitPublished(t, ids[len(ids)-1])
	firstID := rr.r.Status().RelayID
	if err := rr.stop(t); err != nil {
		t.Fatal(err)
	}
	if err := checkDatabase(t, path, cfg, nil); err != nil {
		t.Fatalf("the database that published: %v", err)
	}
	if _, err := outboxtest.Exec(context.Background(), first, `DELETE FROM relay_progress`); err != nil {
		t.Fatal(err)
	}
	if err := checkDatabase(t, path, cfg, nil); err != nil {
		t.Fatalf("progress in Kafka only (a crash before SQLite stored it): %v", err)
	}
	first.Close()
	for _, suf := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + suf); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}

	t.Run("ErrSamePlace", func(t *testing.T) {
		err := checkDatabase(t, path, cfg, nil)
		var nd *NewDatabaseError
		if !errors.Is(err, ErrNewDatabase) || !errors.As(err, &nd) {
			t.Fatalf("a new database at the same path = %v, want a *NewDatabaseError", err)
		}
		host, _ := os.Hostname()
		if nd.RelayID != firstID || nd.Last.LastID != ids[len(ids)-1] || nd.Path != filepath.Clean(path) ||
			nd.Last.Host != host || nd.Topic != DefaultProgressTopic {
			t.Fatalf("found %+v, want relay %s through %d at %s on %s", nd, firstID, ids[len(ids)-1], path, host)
		}
		// A refused start changes nothing: the next one refuses too.
		if err := checkDatabase(t, path, cfg, nil); !errors.Is(err, ErrNewDatabase) {
			t.Fatalf("again: %v, want ErrNewDatabase", err)
		}
	})

	t.Run("OtherPath", func(t *testing.T) {
		if err := checkDatabase(t, filepath.Join(dir, "other.db"), cfg, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("OtherHost", func(t *testing.T) {
		if err := checkDatabase(t, path, cfg, func(r *Relay) { r.host = "elsewhere" }); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("AtLeastOnce", func(t *testing.T) {
		alo := cfg
		alo.Mode = ModeAtLeastOnce
		if err := checkDatabase(t, path, alo, nil); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("NewDatabase", func(t *testing.T) {
		fresh := cfg
		fresh.NewDatabase = true
		if err := checkDatabase(t, path, fresh, nil); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := outboxtest.StoreAt(t, path).AcceptedAsNew(context.Background()); !ok || err != nil {
			t.Fatalf("AcceptedAsNew = %v, %v: the choice must be recorded", ok, err)
		}
		if err := checkDatabase(t, path, cfg, nil); err != nil {
			t.Fatalf("a later start without the flag: %v", err)
		}
	})

	t.Run("KafkaAway", func(t *testing.T) {
		away := cfg
		away.Brokers = []string{"127.0.0.1:1"}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		r, err := New(outboxtest.StoreAt(t, filepath.Join(dir, "away.db")), away)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.CheckDatabase(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("CheckDatabase with Kafka away = %v, want it to wait until ctx is done", err)
		}
	})
}
