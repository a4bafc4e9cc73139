package server

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

const balanceQuery = `queries:
  balance: "SELECT account, balance FROM ledger_balances WHERE feed = 'l' AND account = :account"
  words: "SELECT word, n FROM word_counts WHERE word = :word"
`

func TestMain_Queries(t *testing.T) {
	input, db, args := ledgerSetup(t)
	r := runMain(t, append(args, "--config", writeYAML(t, balanceQuery))...)
	r.ready(t)
	waitPosition(t, db, appendLine(t, input, "a,5\n"))
	get := func(path string) (int, string) {
		res, err := http.Get(r.m.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, string(b)
	}
	want := `{"query":"balance","columns":["account","balance"],"rows":[{"account":"a","balance":6}]}` + "\n"
	if code, body := get("/queries/balance?account=a"); code != 200 || body != want {
		t.Fatalf("%d %s, want 200 %s", code, body, want)
	}
	if code, body := get("/queries/balance?acount=a"); code != 400 ||
		!strings.Contains(body, "unknown parameter acount; missing parameter account") {
		t.Fatalf("%d %s", code, body)
	}
	// No processor made word_counts: the query waits for it, 503.
	if code, body := get("/queries/words?word=x"); code != 503 || !strings.Contains(body, "no such table: word_counts") {
		t.Fatalf("%d %s", code, body)
	}
}

func TestCommand_QueryErrors(t *testing.T) {
	for _, tc := range []struct{ name, query, want string }{
		{"Write", `DELETE FROM outbox`, "queries.q: refused: starts with DELETE"},
		{"WriteInWith", `WITH x AS (SELECT 1) DELETE FROM dead_letters`, "queries.q: refused: WITH ... DELETE: a query is a SELECT, VALUES or WITH ... SELECT"},
		{"WriteInWithNoTable", `WITH x AS (SELECT 1) DELETE FROM balances`, "queries.q: refused: WITH ... DELETE: a query is a SELECT, VALUES or WITH ... SELECT"},
		{"Positional", `SELECT balance FROM ledger_balances WHERE account = ?`, "queries.q: refused: a positional parameter"},
		{"Two", `SELECT 1 AS a; SELECT 2 AS b`, "queries.q: refused: more than one statement"},
		{"Syntax", `SELECT balance FROM ledger_balances WHERE`, "queries.q: incomplete input"},
		{"SameName", `SELECT account, account FROM ledger_balances`, `queries.q: refused: two result columns are named "account"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, db, args := ledgerSetup(t)
			yaml := "queries:\n  q: '" + strings.ReplaceAll(tc.query, "'", "''") + "'\n"
			var out, errOut bytes.Buffer
			path := writeYAML(t, yaml)
			code := Command(append(args, "--config", path), &out, &errOut)
			var lines []string // the error, apart from the log's warnings (the relay is off)
			for _, l := range strings.Split(strings.TrimRight(errOut.String(), "\n"), "\n") {
				if !strings.Contains(l, "level=WARN") {
					lines = append(lines, l)
				}
			}
			sqlite := tc.name == "Syntax" || tc.name == "SameName"
			want := "server: --config " + path + ": line 2: " + tc.want // found as the file is read: its line
			if sqlite {
				want = "server: " + tc.want
			}
			if code != ExitConfig || len(lines) != 1 || !strings.HasPrefix(lines[0], want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and one line starting %q", code, errOut.String(), want)
			}
			if sqlite {
				return // found by SQLite, on the opened database: not claimed
			}
			if _, err := os.Stat(db); !os.IsNotExist(err) {
				t.Fatalf("a start refused before the database was opened left %s (%v)", db, err)
			}
		})
	}
	t.Run("BadName", func(t *testing.T) {
		var out, errOut bytes.Buffer
		code := Command([]string{"--config", writeYAML(t, "queries:\n  'a b': SELECT 1 AS x\n")}, &out, &errOut)
		if code != ExitConfig || !strings.Contains(errOut.String(), "queries.a b: a name is letters") {
			t.Fatalf("exit %d, %q", code, errOut.String())
		}
	})
}
