package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// upper emits each line in capitals on its spec's topic, keyed by the feed.
func upper(spec ProcessorSpec) (ingest.Processor, error) {
	return ingest.ProcessorFunc(func(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, item ingest.Item) error {
		return tx.Emit(ctx, outbox.Output{Topic: spec.Topic, Key: []byte(spec.Feed + "/" + spec.Kind),
			Value: bytes.ToUpper(item.Value)})
	}), nil
}

// feedSetup is ledgerSetup's feed l without its processor.
func feedSetup(t *testing.T) (db string, args []string) {
	_, db, args = ledgerSetup(t)
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--processor" {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return db, out
}

func TestWithProcessor_Runs(t *testing.T) {
	db, args := feedSetup(t)
	args = append(args, "--processor", "l=upper", "--topic", "l=caps")
	cfg, err := ParseConfig(args, env(nil), WithProcessor("upper", upper))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := NewMain(cfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})))
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	waitPosition(t, db, int64(len("a,1\nb,2\n")))
	rows, err := m.Store.Rows(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, fmt.Sprintf("%s %s %s", r.Topic, r.Key, r.Value))
	}
	if want := "caps l/file A,1|caps l/file B,2"; strings.Join(got, "|") != want {
		t.Fatalf("outbox rows %q, want %q", strings.Join(got, "|"), want)
	}
}

func TestWithProcessor_Errors(t *testing.T) {
	_, args := feedSetup(t)
	failing := func(ProcessorSpec) (ingest.Processor, error) { return nil, errors.New("no licence") }
	for _, tc := range []struct {
		name string
		args []string
		opts []Option
		want string
	}{
		{"Unknown", []string{"--processor", "l=nope"}, []Option{WithProcessor("upper", upper)},
			`--processor l=nope: unknown processor "nope" (registered: forward, ledger, orders, upper)`},
		{"BadName", nil, []Option{WithProcessor("a b", upper)}, `processor "a b": a name is letters`},
		{"NilFactory", nil, []Option{WithProcessor("x", nil)}, `processor x: no factory`},
		{"FactoryFails", []string{"--processor", "l=failing"}, []Option{WithProcessor("failing", failing)},
			`feed l: processor failing: no licence`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := Command(append(append([]string{}, args...), tc.args...), &out, &errOut, tc.opts...)
			var lines []string // the error, apart from the log's warnings (the relay is off)
			for _, l := range strings.Split(strings.TrimRight(errOut.String(), "\n"), "\n") {
				if !strings.Contains(l, "level=WARN") {
					lines = append(lines, l)
				}
			}
			if code != ExitConfig || len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and one line with %q", code, errOut.String(), tc.want)
			}
		})
	}
}

// TestWithProcessor_ReplacesBuiltin: a registration under a built-in's
// name wins, so a caller can wrap one.
func TestWithProcessor_ReplacesBuiltin(t *testing.T) {
	_, args := feedSetup(t)
	cfg, err := ParseConfig(append(args, "--processor", "l=ledger"), env(nil), WithProcessor("ledger", upper))
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProcessor("l", "x", cfg.Feeds["l"], cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.(ingest.ProcessorFunc); !ok {
		t.Fatalf("processor %T, want the registered one", p)
	}
}
