package tests

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// logLine finds the log line whose message is msg and returns it, "" when
// there is none.
func logLine(log, msg string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, " msg="+msg+" ") || strings.HasSuffix(l, " msg="+msg) ||
			strings.Contains(l, ` msg="`+msg) {
			return l
		}
	}
	return ""
}

var levelRE = regexp.MustCompile(` level=(\S+) `)

// levelOf is the level of a text log line.
func levelOf(line string) string {
	if m := levelRE.FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return ""
}

// TestStart_NoFeed: a server started with no feed says so at start, as a
// warning with a --feed example, and runs.
func TestStart_NoFeed(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "data", "outboxd.db")
	p := start(t, nil, "--db", db, "--http", "127.0.0.1:0", "--dev-broker-addr", "127.0.0.1:0")
	if code := p.stop(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	log := p.log.String()
	want := `level=WARN msg="no feeds: the server runs and reads nothing; give one, e.g. server --feed ledger=file:./ledger.csv ` +
		`--processor ledger=ledger (or a feeds: section in the file of --config)"`
	if !strings.Contains(log, want+"\n") {
		t.Fatalf("no line %s in:\n%s", want, log)
	}
	if strings.Index(log, "no feeds:") > strings.Index(log, "outboxd running") {
		t.Fatalf("the no-feed warning comes after the start-up line:\n%s", log)
	}
}
