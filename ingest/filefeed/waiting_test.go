package filefeed

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// ffLogs collects a feed's log lines.
type ffLogs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *ffLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns how many lines hold s.
func (l *ffLogs) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// ffOpenLogged opens a new feed on path whose logs go to the returned ffLogs.
func ffOpenLogged(t *testing.T, path string) (*Feed, *ffLogs) {
	t.Helper()
	logs := &ffLogs{}
	f := New(path, Options{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	t.Cleanup(func() { f.Close() })
	if err := f.Open(context.Background(), map[int32]outbox.Checkpoint{}); err != nil {
		t.Fatal(err)
	}
	return f, logs
}

func TestFeed_Waiting(t *testing.T) {
	t.Run("MissingThenCreated", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		f, logs := ffOpenLogged(t, ff.path)
		want := "waiting for " + ff.path + ": no such file"
		if got := f.Waiting(); got != want {
			t.Fatalf("Waiting() = %q, want %q", got, want)
		}
		stop := make(chan struct{})
		var readers sync.WaitGroup
		readers.Go(func() { // Waiting is read while Poll runs
			for {
				select {
				case <-stop:
					return
				default:
					if w := f.Waiting(); w != want && w != "" {
						t.Errorf("Waiting() = %q", w)
						return
					}
				}
			}
		})
		ffNoMore(t, f) // several looks at the missing file
		if n := logs.count(`level=WARN msg="waiting for the file"`); n != 1 {
			t.Errorf("%d warnings about the missing file, want 1", n)
		}
		ff.write("a\n")
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		close(stop)
		readers.Wait()
		if got := f.Waiting(); got != "" {
			t.Errorf("Waiting() = %q once the file is there", got)
		}
		if n := logs.count(`level=INFO msg="file is there: reading it"`); n != 1 {
			t.Errorf("%d info lines about the file appearing, want 1", n)
		}
	})
	t.Run("DeletedThenCreated", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		ff.write("a\n")
		f, logs := ffOpenLogged(t, ff.path)
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
		if got := f.Waiting(); got != "" {
			t.Fatalf("Waiting() = %q with the file there", got)
		}
		ff.remove()
		ffNoMore(t, f)
		if got, want := f.Waiting(), "waiting for "+ff.path+": no such file"; got != want {
			t.Fatalf("Waiting() = %q, want %q", got, want)
		}
		ff.write("b\n")
		e2 := nextFileEpoch(ff.identity(), e)
		ffExpect(t, f, ffEpochRec(e2), ffItem(e2, 2, "b"))
		if got := f.Waiting(); got != "" || logs.count("waiting for the file") != 1 {
			t.Errorf("Waiting() = %q after the file came back; %d warnings", got, logs.count("waiting for the file"))
		}
	})
	t.Run("DirectoryAtThePath", func(t *testing.T) {
		t.Parallel()
		ff := ffNewFile(t)
		if err := os.Mkdir(ff.path, 0o755); err != nil {
			t.Fatal(err)
		}
		f, _ := ffOpenLogged(t, ff.path)
		ffNoMore(t, f)
		if got, want := f.Waiting(), "waiting for "+ff.path+": is a directory, not a file"; got != want {
			t.Fatalf("Waiting() = %q, want %q", got, want)
		}
		if err := os.Remove(ff.path); err != nil {
			t.Fatal(err)
		}
		ff.write("a\n")
		e := ff.epoch()
		ffExpect(t, f, ffEpochRec(e), ffItem(e, 2, "a"))
	})
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "in.csv")
	if err := os.WriteFile(file, []byte("a,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string // want: "" for nil, else what the error says
	}{
		{"ReadableFile", file, ""},
		{"MissingFileExistingDirectory", filepath.Join(dir, "later.csv"), ""},
		{"Directory", sub, "file feed " + sub + ": is a directory, not a file"},
		{"MissingDirectory", filepath.Join(dir, "nope", "x.csv"),
			"file feed " + filepath.Join(dir, "nope", "x.csv") + ": directory " + filepath.Join(dir, "nope") + ": no such file"},
		{"DirectoryIsAFile", filepath.Join(file, "x.csv"),
			"file feed " + filepath.Join(file, "x.csv") + ": " + file + " is not a directory"},
		{"NotARegularFile", os.DevNull, "file feed " + os.DevNull + ": not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.path)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check(%s) = %v, want nil", tc.path, err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
				t.Fatalf("Check(%s) = %v, want %q", tc.path, err, tc.want)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Fatalf("Check(%s) = %q: not one line", tc.path, err)
			}
		})
	}
	t.Run("UnreadableFile", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("running as root: every file can be read, so an unreadable one cannot be made")
		}
		locked := filepath.Join(dir, "locked.csv")
		if err := os.WriteFile(locked, []byte("a,1\n"), 0o000); err != nil {
			t.Fatal(err)
		}
		want := "file feed " + locked + ": cannot be read: permission denied"
		if err := Check(locked); err == nil || err.Error() != want {
			t.Fatalf("Check = %v, want %q", err, want)
		}
	})
}
