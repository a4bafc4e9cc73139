package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/devkafka"
	"github.com/outboxd/outboxd/internal/testutil"
)

// TestDevBroker_RelayAndConsume runs the relay against the dev broker and
// reads the result back with Consume, as `server consume` does.
func TestDevBroker_RelayAndConsume(t *testing.T) {
	b, err := devkafka.Start("127.0.0.1:0", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := devkafka.Start(b.Addr(), nil); err == nil {
		t.Fatal("a second dev broker on the same address started")
	}
	brokers := []string{b.Addr()}
	s := newStore(t)
	ids := emit(t, s, "f", keyed("dev", 40, 4, 0)...)
	rr := startRelay(t, s, testConfig(t, brokers))
	rr.waitPublished(t, ids[len(ids)-1])
	exactlyOnce(t, readCommitted(t, brokers, "dev"), ids)

	out := &testutil.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := devkafka.Consume(ctx, devkafka.ConsumeOptions{
			Brokers: brokers, Topic: "dev", FromBeginning: true, Format: devkafka.FormatJSON,
		}, out)
		done <- err
	}()
	wait(t, 10*time.Second, func() error {
		if n := bytes.Count(out.Bytes(), []byte("\n")); n < len(ids) {
			return fmt.Errorf("%d lines", n)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Consume returned %v", err)
	}
	seen := map[int64]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out.Bytes()))
	for sc.Scan() {
		var r devkafka.ConsumedRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		id := consumedID(t, r)
		if seen[id] || r.Topic != "dev" || r.Key == nil || r.Value == nil || *r.Value != "v"+strconv.FormatInt(id-1, 10) {
			t.Errorf("unexpected line %s", sc.Text())
		}
		seen[id] = true
	}
	if len(seen) != len(ids) {
		t.Errorf("Consume printed %d records, want %d", len(seen), len(ids))
	}
}

func consumedID(t *testing.T, r devkafka.ConsumedRecord) int64 {
	t.Helper()
	for _, h := range r.Headers {
		if h.Key == HeaderID {
			id, err := strconv.ParseInt(h.Value, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
	}
	t.Fatalf("record without %s: %+v", HeaderID, r)
	return 0
}
