package server

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/orders"
	"github.com/outboxd/outboxd/ingest/recording"
	"github.com/outboxd/outboxd/ingest/sqlproc"
)

// RecordConfig says which feeds are recorded, and where (see
// ingest/recording and docs/recording.md).
type RecordConfig struct {
	// Dir receives the recordings of every feed ("" for none); Feeds
	// names a directory per feed, which wins over Dir.
	Dir   string            `yaml:"dir"`
	Feeds map[string]string `yaml:"feeds" usage:"NAME: DIR, the directory of feed NAME's recordings, which wins over record.dir (--record NAME=DIR)"`
	// Snapshot, unless false, copies the database at the start of each
	// run beside its recording, for a replay to start from.
	Snapshot *bool `yaml:"snapshot"`
	// MaxBytes is the size past which a recording file is closed and the
	// next part started, after the transaction that crossed it (0: 1 GiB).
	MaxBytes int64 `yaml:"maxBytes"`
	// MaxAge removes a feed's recordings (a snapshot and the runs
	// recorded from it, whole) once their newest file is older than this
	// (0: kept for ever).
	MaxAge time.Duration `yaml:"maxAge"`
	// MaxTotalBytes caps what a feed's recordings hold on disk: the
	// oldest are removed past it, and when the newest alone reach it the
	// recorder pauses (never the feed) until MaxAge frees room (0: no cap).
	MaxTotalBytes int64 `yaml:"maxTotalBytes"`
	// SnapshotInterval lets a run (a restart) record from the feed's last
	// snapshot when it is younger than this, rather than copy the database
	// again (0: a snapshot every run).
	SnapshotInterval time.Duration `yaml:"snapshotInterval"`
}

// Defaults of the recording's retention.
const (
	DefaultRecordMaxAge           = 7 * 24 * time.Hour
	DefaultRecordMaxTotalBytes    = 10 << 30
	DefaultRecordSnapshotInterval = time.Hour
)

// flags registers the recording's flags on fs.
func (r *RecordConfig) flags(fs *flag.FlagSet) {
	fs.Var(recordFlag{r}, "record",
		"record every feed into `DIR`, or with NAME=DIR feed NAME into DIR (repeatable, or comma-separated)")
	fs.Var(snapshotFlag{r}, "record-snapshot",
		"copy the database at the start of each recorded run beside its recording (=false: replays start from a database you name)")
	fs.Int64Var(&r.MaxBytes, "record-max-bytes", r.MaxBytes,
		"start a recording's next file once it holds `N` bytes, never splitting a transaction (0: 1 GiB)")
	fs.DurationVar(&r.MaxAge, "record-max-age", r.MaxAge,
		"remove a feed's recordings (a snapshot and the runs recorded from it) once their newest file is older than `D` (0: never)")
	fs.Int64Var(&r.MaxTotalBytes, "record-max-total-bytes", r.MaxTotalBytes,
		"a feed's recordings hold at most `N` bytes: the oldest are removed past it, and the recorder (not the feed) pauses when "+
			"the newest alone reach it, until --record-max-age frees room (0: no cap)")
	fs.DurationVar(&r.SnapshotInterval, "record-snapshot-interval", r.SnapshotInterval,
		"a restart records from the feed's last snapshot when it is younger than `D`, rather than copy the database again (0: a snapshot every run)")
}

// recordFlag is --record: DIR, or NAME=DIR (a DIR holding "=" needs a "/"
// before it).
type recordFlag struct{ r *RecordConfig }

func (f recordFlag) String() string { return "" }

func (f recordFlag) settingKey() string { return "record.dir" }

func (f recordFlag) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		name, dir, ok := strings.Cut(v, "=")
		if !ok || !validName(name) {
			f.r.Dir = v
			continue
		}
		if dir == "" {
			return fmt.Errorf("%q: want NAME=DIR", v)
		}
		if f.r.Feeds == nil {
			f.r.Feeds = map[string]string{}
		}
		f.r.Feeds[name] = dir
	}
	return nil
}

// snapshotFlag is --record-snapshot, a boolean whose default is true.
type snapshotFlag struct{ r *RecordConfig }

func (f snapshotFlag) IsBoolFlag() bool { return true }

func (f snapshotFlag) settingKey() string { return "record.snapshot" }

func (f snapshotFlag) String() string {
	if f.r == nil {
		return "true"
	}
	return strconv.FormatBool(f.r.snapshot())
}

func (f snapshotFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q: want true or false", s)
	}
	f.r.Snapshot = &v
	return nil
}

func (r RecordConfig) snapshot() bool { return r.Snapshot == nil || *r.Snapshot }

func (r RecordConfig) maxBytes() int64 {
	if r.MaxBytes == 0 {
		return recording.DefaultMaxBytes
	}
	return r.MaxBytes
}

// dirOf is the directory feed is recorded into, "" for none.
func (r RecordConfig) dirOf(feed string) string {
	if d, ok := r.Feeds[feed]; ok {
		return d
	}
	return r.Dir
}

// check reports the first unusable recording setting, naming its flag:
// feeds are the configured feeds' names.
func (r RecordConfig) check(feeds []string) error {
	switch {
	case r.MaxBytes != 0 && r.MaxBytes < recording.MinMaxBytes:
		return fmt.Errorf("--record-max-bytes: %d, want at least %d (or 0 for 1 GiB)", r.MaxBytes, recording.MinMaxBytes)
	case r.MaxAge < 0:
		return fmt.Errorf("--record-max-age: %v, want 0 (never) or more", r.MaxAge)
	case r.MaxTotalBytes < 0 || (r.MaxTotalBytes > 0 && r.MaxTotalBytes < r.maxBytes()):
		return fmt.Errorf("--record-max-total-bytes: %d, want 0 (no cap) or at least --record-max-bytes (%d)", r.MaxTotalBytes, r.maxBytes())
	case r.SnapshotInterval < 0:
		return fmt.Errorf("--record-snapshot-interval: %v, want 0 (a snapshot every run) or more", r.SnapshotInterval)
	}
	for name, dir := range r.Feeds {
		if !containsName(feeds, name) {
			return fmt.Errorf("--record %s=%s: no feed %s is configured", name, dir, name)
		}
	}
	for _, name := range feeds {
		if dir := r.dirOf(name); dir != "" {
			if err := checkRecordDir(dir); err != nil {
				return fmt.Errorf("--record %s: %w", dir, err)
			}
		}
	}
	return nil
}

func containsName(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// checkRecordDir checks dir is a directory this process can write in, or
// a missing one whose closest existing parent is: it creates nothing.
func checkRecordDir(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if errors.Is(err, os.ErrNotExist) && filepath.Dir(d) != d {
			continue
		}
		switch {
		case err != nil:
			return err
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory", d)
		}
		return checkWritableDir(d)
	}
}

// checkWritableDir checks a file can be created in dir.
func checkWritableDir(dir string) error {
	f, err := os.CreateTemp(dir, ".outboxd-record-check-*")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// newRecorder returns the recorder of feed name when it is recorded, nil
// otherwise; cfg is its loop's configuration.
func (m *Main) newRecorder(name string, fc *FeedConfig, cfg ingest.Config) (ingest.Recorder, error) {
	dir := m.Config.Record.dirOf(name)
	if dir == "" {
		return nil, nil
	}
	kind, target, _ := strings.Cut(fc.Source, ":")
	pc := processorConfig(fc, m.Config)
	dlq := cfg.DeadLetterTopic
	if dlq == "" {
		dlq = name + ".dlq"
	}
	rec, err := recording.NewRecorder(recording.Options{
		Dir: dir, Store: m.Store, Snapshot: m.Config.Record.snapshot(), MaxBytes: m.Config.Record.maxBytes(), Logger: m.Logger,
		Retention:        recording.Retention{MaxAge: m.Config.Record.MaxAge, MaxTotalBytes: m.Config.Record.MaxTotalBytes},
		SnapshotInterval: m.Config.Record.SnapshotInterval,
		Header: recording.Header{
			Outboxd: Version(), Feed: name, Kind: kind, Source: target,
			Processor: fc.Processor, ProcessorConfig: pc, Fingerprint: recording.Fingerprint(fc.Processor, pc),
			Loop: recording.LoopSettings{
				BatchMax: cfg.BatchMax, BatchBytes: cfg.BatchBytes, RetryAttempts: cfg.Retry.Attempts,
				AttemptTimeout: cfg.Retry.AttemptTimeout.String(), OnFailure: cfg.OnFailure,
				OnCompletionFailure: cfg.OnCompletionFailure, MaxMessageBytes: cfg.MaxMessageBytes, DeadLetterTopic: dlq,
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("feed %s: %w", name, err)
	}
	return rec, nil
}

// Keys of a recorded SQL processor's configuration (Header.ProcessorConfig).
const (
	recordedKind       = "kind"       // sqlproc.Kind
	recordedDefinition = "definition" // sqlproc.Config.Definition
	recordedVersion    = "version"    // sqlproc.DefinitionVersion
)

// processorConfig is what a processor's decisions depend on, besides its
// code: recorded with each recording, and what a replay builds the
// processor from.
func processorConfig(fc *FeedConfig, c Config) map[string]string {
	pc := map[string]string{"topic": fc.Topic}
	if c.declaredProcessor(fc.Processor) {
		// A SQL processor's whole definition: its SQL text, its input's
		// description and settings, and its version, so that two versions
		// fingerprint differently and a replay can build it again.
		sc, err := c.resolvedSQLConfig(fc.Processor, fc.Topic, nil) // with what it reads
		if err != nil {                                             // refused at start already
			sc = c.Processors[fc.Processor].sqlConfig(fc.Processor, fc.Topic)
		}
		def, err := sc.Definition()
		if err != nil {
			panic(fmt.Sprintf("definition of processor %s: %v", fc.Processor, err)) // strings, bools, lists and maps of them
		}
		pc[recordedKind], pc[recordedDefinition] = sqlproc.Kind, string(def)
		pc[recordedVersion] = strconv.Itoa(sqlproc.DefinitionVersion(def))
		return pc
	}
	switch fc.Processor {
	case "forward":
		pc["keyField"] = strconv.Itoa(fc.KeyField)
	case orders.Name:
		pc["retryDelay"] = c.RetryDelay.String()
		pc["retryAttempts"] = strconv.Itoa(c.RetryAttempts)
	}
	return pc
}

// feedConfigOf rebuilds a feed's settings, for processor p, from a
// recorded processor configuration; c gets the settings kept outside
// the feed's (orders' retries).
func feedConfigOf(h recording.Header, p string, c *Config) (*FeedConfig, error) {
	fc := &FeedConfig{Source: h.Kind + ":" + h.Source, Processor: p, Topic: h.ProcessorConfig["topic"]}
	if fc.Topic == "" {
		fc.Topic = h.Feed + ".out"
	}
	var err error
	if h.ProcessorConfig[recordedKind] == sqlproc.Kind && p == h.Processor {
		sc, err := sqlproc.ParseDefinition(p, []byte(h.ProcessorConfig[recordedDefinition]))
		if err != nil {
			return nil, err
		}
		c.Processors = map[string]*ProcessorConfig{p: {Config: sc}}
		return fc, nil
	}
	if v, ok := h.ProcessorConfig["keyField"]; ok && p == "forward" {
		if fc.KeyField, err = strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("recorded keyField %q: %w", v, err)
		}
	}
	if v, ok := h.ProcessorConfig["retryDelay"]; ok {
		if c.RetryDelay, err = time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("recorded retryDelay %q: %w", v, err)
		}
	}
	if v, ok := h.ProcessorConfig["retryAttempts"]; ok {
		if c.RetryAttempts, err = strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("recorded retryAttempts %q: %w", v, err)
		}
	}
	return fc, nil
}

// Recording is the feed's recording, nil when it is not recorded.
func (f apiFeed) Recording() *api.RecordingStatus {
	rec, ok := f.l.Config().Recorder.(*recording.Recorder)
	if !ok {
		return nil
	}
	s := rec.Status()
	return &api.RecordingStatus{Recording: s.Recording, File: s.File, Bytes: s.Bytes, Files: s.Files, Error: s.Error,
		DiskBytes: s.DiskBytes, Paused: s.Paused, RemovedFiles: s.RemovedFiles, RemovedBytes: s.RemovedBytes}
}
