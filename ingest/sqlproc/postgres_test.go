package sqlproc_test

import (
	"reflect"
	"testing"

	"context"

	"github.com/outboxd/outboxd/ingest/ledger"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

// openPGStore opens a store on a database of the test's own.
func openPGStore(t *testing.T) *outbox.Store {
	t.Helper()
	return outboxtest.OpenStore(t, outbox.DefaultConfig(pgtest.New(t).DSN))
}

func newPGProc(tb testing.TB, cfg sqlproc.Config) *sqlproc.Processor {
	tb.Helper()
	p, err := sqlproc.NewPostgres(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestGolden_LedgerPostgres runs the Go ledger on SQLite and the SQL
// ledger of testdata/ledger.pg.yaml on PostgreSQL through the real file
// feed and loop over the same file: the outputs, the dead letters and the
// balances are the same, byte for byte.
func TestGolden_LedgerPostgres(t *testing.T) {
	lines := goldenInput(3000, 1)
	path, ends := writeLines(t, lines...)
	end := ends[len(ends)-1]

	goStore := openStore(t, nil)
	goRun := startLoop(t, goStore, "ledger", path, ledger.New("ledger.out"), nil)
	pgStore := openPGStore(t)
	pgRun := startLoop(t, pgStore, "ledger", path, newPGProc(t, loadConfig(t, "ledger", "testdata/ledger.pg.yaml")), nil)
	waitApplied(t, goStore, "ledger", end)
	waitApplied(t, pgStore, "ledger", end)
	goRun.stop(t)
	pgRun.stop(t)

	goOut, pgOut := ledgerOutputs(t, goStore), ledgerOutputs(t, pgStore)
	if len(goOut) < 2500 {
		t.Fatalf("the Go ledger made %d outputs of %d lines: the input is not what the test means", len(goOut), len(lines))
	}
	for i := range max(len(goOut), len(pgOut)) {
		if i >= len(goOut) || i >= len(pgOut) || !reflect.DeepEqual(goOut[i], pgOut[i]) {
			t.Fatalf("output %d of %d/%d differs:\n Go:  %s\n PG:  %s", i, len(goOut), len(pgOut), describe(goOut, i), describe(pgOut, i))
		}
	}
	goDead, pgDead := deadPlaces(t, goStore), deadPlaces(t, pgStore)
	if len(goDead) < 100 {
		t.Fatalf("the Go ledger dead-lettered %d lines: the input is not what the test means", len(goDead))
	}
	if !reflect.DeepEqual(goDead, pgDead) {
		t.Fatalf("dead letters differ:\n Go:  %v\n PG:  %v", goDead, pgDead)
	}
	for i, dl := range deadLetters(t, pgStore, "ledger") {
		if want := lineAt(lines, ends, dl.Position); string(dl.Payload) != want {
			t.Fatalf("dead letter %d holds %q, want the line %q", i, dl.Payload, want)
		}
	}
	goBal, err := ledger.Balances(context.Background(), goStore, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if pgBal := sqlBalances(t, pgStore); !reflect.DeepEqual(goBal, pgBal) || len(goBal) < 10 {
		t.Fatalf("balances differ:\n Go:  %v\n PG:  %v", goBal, pgBal)
	}
	t.Logf("%d lines: %d outputs, %d dead letters, %d accounts, all equal", len(lines), len(goOut), len(goDead), len(goBal))
}
