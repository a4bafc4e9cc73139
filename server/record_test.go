package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/outbox"
)

func TestRecordConfig_Parse(t *testing.T) {
	t.Run("Flags", func(t *testing.T) {
		c, err := ParseConfig([]string{"--feed", "l=file:/a", "--feed", "m=file:/b", "--record", "/rec",
			"--record", "m=/rec-m,x.y=/odd=dir", "--record-snapshot=false", "--record-max-bytes", "1048576"}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		r := c.Record
		if r.dirOf("l") != "/rec" || r.dirOf("m") != "/rec-m" || r.Feeds["x.y"] != "/odd=dir" || r.snapshot() || r.maxBytes() != 1<<20 {
			t.Fatalf("record config %+v (snapshot %v)", r, r.snapshot())
		}
	})
	t.Run("DirWithEquals", func(t *testing.T) {
		c, err := ParseConfig([]string{"--feed", "l=file:/a", "--record", "./a=b/rec"}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if c.Record.Dir != "./a=b/rec" || len(c.Record.Feeds) != 0 {
			t.Fatalf("record config %+v: a DIR with a / before its = is a directory", c.Record)
		}
	})
	t.Run("Defaults", func(t *testing.T) {
		c, err := ParseConfig([]string{"--feed", "l=file:/a"}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if c.Record.dirOf("l") != "" || !c.Record.snapshot() || c.Record.maxBytes() != recording.DefaultMaxBytes {
			t.Fatalf("record defaults %+v", c.Record)
		}
	})
	t.Run("EnvAndFile", func(t *testing.T) {
		yml := filepath.Join(t.TempDir(), "c.yaml")
		os.WriteFile(yml, []byte("record:\n  dir: /from/file\n  snapshot: false\n  maxBytes: 2097152\n"), 0o644)
		c, err := ParseConfig([]string{"--config", yml, "--feed", "l=file:/a"},
			env(map[string]string{"OUTBOXD_RECORD": "l=/from/env", "OUTBOXD_RECORD_SNAPSHOT": "true"}))
		if err != nil {
			t.Fatal(err)
		}
		r := c.Record
		if r.Dir != "/from/file" || r.dirOf("l") != "/from/env" || !r.snapshot() || r.MaxBytes != 2<<20 {
			t.Fatalf("record config %+v", r)
		}
	})
}

// TestRecordConfig_Refused: a recording setting the server cannot use is
// one line and exit code 2, before anything is opened.
func TestRecordConfig_Refused(t *testing.T) {
	_, db, args := ledgerSetup(t)
	notDir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notDir, nil, 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"UnknownFeed", []string{"--record", "nosuch=" + t.TempDir()}, "no feed nosuch is configured"},
		{"MaxBytes", []string{"--record", t.TempDir(), "--record-max-bytes", "100"}, "--record-max-bytes: 100, want at least 65536"},
		{"NotADirectory", []string{"--record", filepath.Join(notDir, "sub")}, "not a directory"},
		{"BadSnapshot", []string{"--record-snapshot=maybe"}, `"maybe": want true or false`},
		{"MaxAge", []string{"--record", t.TempDir(), "--record-max-age", "-1h"}, "--record-max-age: -1h0m0s, want 0 (never) or more"},
		{"MaxTotal", []string{"--record", t.TempDir(), "--record-max-total-bytes", "1000"},
			"--record-max-total-bytes: 1000, want 0 (no cap) or at least --record-max-bytes (1073741824)"},
		{"SnapshotInterval", []string{"--record", t.TempDir(), "--record-snapshot-interval", "-1s"}, "--record-snapshot-interval: -1s, want 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Command(append(append([]string{}, args...), tc.args...), &stdout, &stderr)
			msg := stderr.String()
			if code != ExitConfig || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tc.want) {
				t.Fatalf("exit %d, stderr %q: want 2 and one line saying %q", code, msg, tc.want)
			}
			if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the database was created (%v)", err)
			}
		})
	}
}

// TestMain_Recording records a running ledger feed: its status and
// metrics say so, and the recording replays to identical outputs and
// state; another processor diverges (exit 1), a damaged recording is
// refused (exit 2).
func TestMain_Recording(t *testing.T) {
	input, db, args := ledgerSetup(t)
	dir := filepath.Join(t.TempDir(), "rec")
	r := runMain(t, append(args, "--record", dir)...)
	r.ready(t)
	appendLine(t, input, "not a ledger line\n")
	waitPosition(t, db, appendLine(t, input, "a,5\n"))
	st := feedRecording(t, r.m.URL())
	if st == nil || !st.Recording || filepath.Dir(st.File) != dir || st.Bytes == 0 || st.Files != 1 || st.Error != "" {
		t.Fatalf("status recording %+v: want it recording into %s", st, dir)
	}
	// Every file of the feed's recordings on disk: the snapshot and the part.
	var onDisk int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		fi, _ := e.Info()
		onDisk += fi.Size()
	}
	if len(ents) != 2 || st.DiskBytes != onDisk || st.Paused != "" || st.RemovedFiles != 0 {
		t.Fatalf("status recording %+v: want %d bytes on disk in 2 files (%d files)", st, onDisk, len(ents))
	}
	if m, want := metricLine(t, r.m.URL(), api.MetricFeedRecordingDiskBytes), fmt.Sprintf(`%s{feed="l"} %d`, api.MetricFeedRecordingDiskBytes, onDisk); m != want {
		t.Fatalf("metric %q, want %q", m, want)
	}
	if m, want := metricLine(t, r.m.URL(), api.MetricFeedRecordingPaused), api.MetricFeedRecordingPaused+`{feed="l"} 0`; m != want {
		t.Fatalf("metric %q, want %q", m, want)
	}
	// Idle now: the bytes stay as the status said.
	if m, want := metricLine(t, r.m.URL(), api.MetricFeedRecordingBytes), fmt.Sprintf(`%s{feed="l"} %d`, api.MetricFeedRecordingBytes, st.Bytes); m != want {
		t.Fatalf("metric %q, want %q", m, want)
	}
	if m, want := metricLine(t, r.m.URL(), api.MetricFeedRecording), api.MetricFeedRecording+`{feed="l"} 1`; m != want {
		t.Fatalf("metric %q, want %q", m, want)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	t.Run("Identical", func(t *testing.T) {
		rep, code := replayJSON(t, dir, "--db", filepath.Join(t.TempDir(), "out.db"), "--diff", db)
		if code != ReplayIdentical || rep.Verdict != "identical" || rep.Replay.Items != 4 || rep.Replay.Applied != 3 ||
			rep.Replay.DeadLettered != 1 || rep.Diff.Deliveries != 4 || rep.Diff.OutputsDatabase != 4 || rep.Processor.Fingerprint != rep.Processor.RecordedFingerprint {
			t.Fatalf("exit %d, report %+v, diff %+v", code, rep, rep.Diff)
		}
	})
	t.Run("OtherProcessor", func(t *testing.T) {
		rep, code := replayJSON(t, dir, "--processor", "forward", "--diff", db)
		if code != ReplayDivergent || rep.Verdict != "divergent" || rep.Diff.Divergent != 4 || rep.Diff.First == nil ||
			rep.Diff.First.Position != int64(len("a,1\n")) || rep.Replay.DecisionsDiffering != 1 {
			t.Fatalf("exit %d, report %+v, diff %+v", code, rep, rep.Diff)
		}
	})
	t.Run("IntoAnExistingReplay", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out.db")
		if _, code := replayJSON(t, dir, "--db", out); code != ReplayIdentical {
			t.Fatalf("first replay: exit %d", code)
		}
		var stdout, stderr bytes.Buffer
		code := replayCommand(context.Background(), []string{dir, "--db", out}, &stdout, &stderr)
		want := "server replay: --db " + out + " exists already, a replay that stands at the end of these recordings " +
			"(l: partition 0 at 30): give --db a path that does not exist (or remove " + out + ") to replay them again, " +
			"or name only the recordings after it to go on from it\n"
		if code != ReplayFailed || stderr.String() != want || stdout.Len() != 0 {
			t.Fatalf("exit %d, stdout %q, stderr\n%q\nwant\n%q", code, stdout.String(), stderr.String(), want)
		}
	})
	t.Run("BadRecording", func(t *testing.T) {
		paths, _ := filepath.Glob(filepath.Join(dir, "*.rec"))
		data, err := os.ReadFile(paths[0])
		if err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(t.TempDir(), "bad.rec")
		data[len(recording.Magic)+1]++ // the version
		os.WriteFile(bad, data, 0o644)
		var stdout, stderr bytes.Buffer
		code := replayCommand(context.Background(), []string{bad}, &stdout, &stderr)
		if code != ReplayFailed || !strings.Contains(stderr.String(), "unknown recording format version 3") || strings.Count(stderr.String(), "\n") != 1 {
			t.Fatalf("exit %d, stderr %q", code, stderr.String())
		}
	})
}

func replayJSON(t *testing.T, args ...string) (replayReport, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := replayCommand(context.Background(), append(args, "--json"), &stdout, &stderr)
	var rep replayReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, stdout %q, stderr %q: %v", code, stdout.String(), stderr.String(), err)
	}
	return rep, code
}

func feedRecording(t *testing.T, base string) *api.RecordingStatus {
	t.Helper()
	res, err := http.Get(base + "/feeds/l/status")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var fs api.FeedStatus
	if err := json.NewDecoder(res.Body).Decode(&fs); err != nil {
		t.Fatal(err)
	}
	return fs.Recording
}

func metricLine(t *testing.T, base, name string) string {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name+"{") {
			return l
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return ""
}

// TestMain_RecordingKafka records a Kafka feed of three partitions (keys,
// values and headers) and replays it to identical outputs and positions.
func TestMain_RecordingKafka(t *testing.T) {
	dir := t.TempDir()
	db, rec := filepath.Join(dir, "outboxd.db"), filepath.Join(dir, "rec")
	r := runMain(t, "--db", db, "--feed", "k=kafka:events", "--processor", "k=forward", "--relay", "none",
		"--http", "127.0.0.1:0", "--dev-broker-addr", "127.0.0.1:0", "--dev-broker-data", "", "--record", rec)
	r.ready(t)
	var in strings.Builder
	const n = 300
	for i := range n {
		fmt.Fprintf(&in, `{"key":"k-%d","value":"v-%d","headers":{"h":"%d"}}`+"\n", i%17, i, i)
	}
	if got, err := produceLines(context.Background(), produceOptions{Brokers: []string{r.m.Broker.Addr()}, Topic: "events",
		JSON: true, Partition: unset, MaxLine: toolMaxLine, ConnectTimeout: toolConnectTimeout},
		strings.NewReader(in.String())); err != nil || got != n {
		t.Fatalf("produced %d of %d: %v", got, n, err)
	}
	wait(t, 30*time.Second, func() error {
		s, err := outbox.OpenExisting(context.Background(), db)
		if err != nil {
			return err
		}
		defer s.Close()
		cps, err := s.ReadPositions(context.Background(), "k")
		if err != nil {
			return err
		}
		sum := int64(0)
		for _, c := range cps {
			sum += c.Position
		}
		if len(cps) != 3 || sum != n {
			return fmt.Errorf("positions %+v, want 3 partitions summing to %d", cps, n)
		}
		return nil
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rep, code := replayJSON(t, rec, "--diff", db)
	if code != ReplayIdentical || rep.Replay.Items != n || rep.Replay.Applied != n || rep.Diff.Deliveries != n ||
		rep.Diff.OutputsDatabase != n || rep.Diff.Positions != "" || rep.Replay.EpochChanges != 3 {
		t.Fatalf("exit %d, replay %+v, diff %+v", code, rep.Replay, rep.Diff)
	}
}

// TestMain_RecordingWithoutSnapshot: with --record-snapshot=false a replay
// starts from the copy the user kept (--from), and refuses to start from
// nothing when the recording does not.
func TestMain_RecordingWithoutSnapshot(t *testing.T) {
	input, db, args := ledgerSetup(t)
	r := runMain(t, args...)
	r.ready(t)
	waitPosition(t, db, int64(len("a,1\nb,2\n")))
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	data, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(backup, data, 0o644) // the user's own copy, taken while the server is down
	dir := filepath.Join(t.TempDir(), "rec")
	r = runMain(t, append(args, "--record", dir, "--record-snapshot=false")...)
	r.ready(t)
	waitPosition(t, db, appendLine(t, input, "a,5\n"))
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if snaps, _ := filepath.Glob(filepath.Join(dir, "*.snapshot.db")); len(snaps) != 0 {
		t.Fatalf("snapshots %v with --record-snapshot=false", snaps)
	}
	rep, code := replayJSON(t, dir, "--from", backup, "--db", filepath.Join(t.TempDir(), "out.db"), "--diff", db)
	if code != ReplayIdentical || rep.Restored != backup || rep.Replay.Items != 1 || rep.Diff.Deliveries != 1 || !rep.Diff.Identical {
		t.Fatalf("exit %d, report %+v, diff %+v", code, rep, rep.Diff)
	}
	var stdout, stderr bytes.Buffer
	code = replayCommand(context.Background(), []string{dir}, &stdout, &stderr)
	if code != ReplayFailed || !strings.Contains(stderr.String(), "the database stands at nothing (a new feed)") {
		t.Fatalf("exit %d, stderr %q: want 2, the new database is not where the recording starts", code, stderr.String())
	}
	if data2, _ := os.ReadFile(backup); !bytes.Equal(data, data2) {
		t.Fatal("the replay changed the copy it started from")
	}
}
