package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// docsProgram is the Go code block of docs/processors.md's "Your own processor".
func docsProgram(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/processors.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Your own processor\n")
	if !ok {
		t.Fatal(`docs/processors.md has no "## Your own processor" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, code, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal("docs/processors.md's own processor section has no Go code block")
	}
	code, _, ok = strings.Cut(code, "\n```\n")
	if !ok {
		t.Fatal("docs/processors.md's Go code block does not end")
	}
	return code + "\n"
}

// docsBuildCommands are the shell commands of docs/processors.md's block that builds
// the program against a local checkout: the first sh block after the
// program, one command a line.
func docsBuildCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/processors.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "\n## Your own processor\n")
	_, after, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal("docs/processors.md's own processor section has no Go code block")
	}
	_, block, ok := strings.Cut(after, "\n```sh\n")
	if !ok {
		t.Fatal("docs/processors.md's own processor section has no sh block after the program")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("docs/processors.md's sh block does not end")
	}
	cmds := strings.Split(block, "\n")
	if len(cmds) != 4 || !strings.Contains(block, "go mod edit -replace github.com/outboxd/outboxd=../outboxd") ||
		!strings.HasSuffix(block, "go build -o words .") {
		t.Fatalf("docs/processors.md's build block is not go mod init, go mod edit -replace ..=../outboxd, go mod tidy, go build -o words .:\n%s", block)
	}
	return cmds
}

// buildDocsProgram does what docs/processors.md says: with this checkout as
// ../outboxd and docs/processors.md's program as main.go in a new directory words, it
// runs docs/processors.md's build commands one by one, as written, and returns the
// program they built.
func buildDocsProgram(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	top := t.TempDir()
	if err := os.Symlink(root, filepath.Join(top, "outboxd")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(top, "words")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(docsProgram(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOFLAGS=") })
	for _, line := range docsBuildCommands(t) {
		cmd := exec.CommandContext(ctx, "sh", "-c", line)
		cmd.Dir = dir
		cmd.Env = append(env, "GOWORK=off") // a user's module, not a workspace
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("docs/processors.md's %q: %v\n%s", line, err, out)
		}
	}
	for _, f := range []string{"go.mod", "go.sum", "words"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("after docs/processors.md's commands: %v", err)
		}
	}
	return filepath.Join(dir, "words")
}

// TestLibrary_DocsProgram builds docs/processors.md's own-processor program as
// docs/processors.md says, in a module of its own, runs it over a file with the dev
// broker, and reads what it published with its own consume subcommand.
func TestLibrary_DocsProgram(t *testing.T) {
	bin := buildDocsProgram(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "data", "outboxd.db")
	words := filepath.Join(dir, "words.txt")
	if err := os.WriteFile(words, []byte("apple\nbanana\napple\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	queries := filepath.Join(dir, "outboxd.yaml")
	if err := os.WriteFile(queries, []byte("queries:\n  count: SELECT word, n FROM word_counts WHERE word = :word\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	broker, api := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	p := startBin(t, bin, nil, "--config", queries, "--db", db, "--http", api, "--dev-broker-addr", broker,
		"--feed", "words=file:"+words, "--processor", "words=counter")
	waitRelayed(t, db, 4) // three counts and the empty line's dead letter

	run := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, errb.String())
		}
		return out.String(), errb.String()
	}
	out, stderr := run("consume", "--brokers", broker, "--topic", "words.out", "--from-beginning", "--until-end", "--format", "json")
	if strings.TrimSpace(stderr) != "3 records" {
		t.Fatalf("consume words.out: %s", stderr)
	}
	counts := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Key, Value string
			Headers    []struct{ Key, Value string }
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if len(r.Headers) < 2 || r.Headers[1].Key != "outboxd-feed" || r.Headers[1].Value != "words" {
			t.Fatalf("record %s: want the header outboxd-feed words", line)
		}
		counts[r.Key] = append(counts[r.Key], r.Value)
	}
	if got := fmt.Sprint(counts); got != "map[apple:[1 2] banana:[1]]" {
		t.Fatalf("counts published %s, want apple 1 then 2, banana 1", got)
	}
	out, stderr = run("consume", "--brokers", broker, "--topic", "words.dlq", "--from-beginning", "--until-end", "--format", "json")
	if strings.TrimSpace(stderr) != "1 records" || !strings.Contains(out, `{"key":"outboxd-reason","value":"malformed"}`) {
		t.Fatalf("consume words.dlq: %s\n%s", stderr, out)
	}
	// The library's server serves the state queries over the processor's
	// own table, created by its Setup.
	code, body := httpGet(t, "http://"+api+"/queries/count?word=apple")
	if want := `{"query":"count","columns":["word","n"],"rows":[{"word":"apple","n":2}]}` + "\n"; code != 200 || body != want {
		t.Fatalf("GET /queries/count: %d %s, want 200 %s", code, body, want)
	}
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	// An unknown processor is one line naming the registered ones, exit 2.
	cmd := exec.Command(bin, "--db", db, "--feed", "words=file:"+words, "--processor", "words=nope")
	b, _ := cmd.CombinedOutput()
	// The program's own name, not server's.
	want := `words: --processor words=nope: unknown processor "nope" (registered: counter, forward, ledger, orders) (see words -h)` + "\n"
	if cmd.ProcessState.ExitCode() != 2 || string(b) != want {
		t.Fatalf("unknown processor: exit %d, %q; want 2, %q", cmd.ProcessState.ExitCode(), b, want)
	}
}

// waitRelayed waits until the database holds rows outbox rows and the
// relay has published them all.
func waitRelayed(t *testing.T, db string, rows int64) {
	t.Helper()
	wait(t, 60*time.Second, func() error {
		s, err := outbox.Open(context.Background(), outbox.DefaultConfig(db))
		if err != nil {
			return err
		}
		defer s.Close()
		last, err := s.LastOutboxID(context.Background())
		if err != nil {
			return err
		}
		if last != rows {
			return fmt.Errorf("%d outbox rows, want %d", last, rows)
		}
		return relayDone(context.Background(), s)
	})
}

// httpGet returns the status and body of a GET.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
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
