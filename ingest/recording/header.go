package recording

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Header describes a recording file: its run, its feed and processor, and
// where the run (or, for a later part, the file) started.
type Header struct {
	// Outboxd is the version of the outboxd that wrote the recording.
	Outboxd string `json:"outboxd"`
	// Feed, Kind and Source describe the feed recorded.
	Feed   string `json:"feed"`
	Kind   string `json:"kind"`
	Source string `json:"source"`
	// Processor names the feed's processor; ProcessorConfig is its
	// configuration (its output topic, its options) and Fingerprint a
	// hash of both (see Fingerprint), so a replay can tell whether it
	// runs the recorded processor.
	Processor       string            `json:"processor"`
	ProcessorConfig map[string]string `json:"processorConfig,omitempty"`
	Fingerprint     string            `json:"fingerprint"`
	// Loop is the loop's settings that its decisions depend on.
	Loop LoopSettings `json:"loop"`
	// Run names the run (its start, UTC); Part numbers the run's files
	// from 1 (a recording rotates by size).
	Run       string    `json:"run"`
	Part      int       `json:"part"`
	StartedAt time.Time `json:"startedAt"`
	// From is each partition's committed checkpoint when the file starts:
	// for part 1, when the run started.
	From []Checkpoint `json:"from"`
	// Snapshot names the copy of the database as of From, in the file's
	// directory ("" when none: --record-snapshot=false, or a later part).
	// SnapshotRun, when not "", is the earlier run whose start the
	// snapshot holds (a run that reused it): a replay starts from that
	// run's recordings.
	Snapshot    string `json:"snapshot,omitempty"`
	SnapshotRun string `json:"snapshotRun,omitempty"`
}

// LoopSettings are the settings of the recorded loop that a replay uses.
type LoopSettings struct {
	BatchMax            int                     `json:"batchMax"`
	BatchBytes          int                     `json:"batchBytes"`
	RetryAttempts       int                     `json:"retryAttempts"`
	AttemptTimeout      string                  `json:"attemptTimeout"`
	OnFailure           ingest.FailurePolicy    `json:"onFailure"`
	OnCompletionFailure ingest.CompletionPolicy `json:"onCompletionFailure"`
	MaxMessageBytes     int                     `json:"maxMessageBytes"`
	DeadLetterTopic     string                  `json:"deadLetterTopic"`
}

// Checkpoint is a partition's epoch and position.
type Checkpoint struct {
	Partition int32  `json:"partition"`
	Epoch     string `json:"epoch"`
	Position  int64  `json:"position"`
}

// Fingerprint is a short hash of a processor's name and configuration.
func Fingerprint(processor string, config map[string]string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q", processor)
	for _, k := range slices.Sorted(maps.Keys(config)) {
		fmt.Fprintf(h, " %q=%q", k, config[k])
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// checkpointsOf lists cps by partition.
func checkpointsOf(cps map[int32]outbox.Checkpoint) []Checkpoint {
	out := make([]Checkpoint, 0, len(cps))
	for _, p := range sortedPartitions(cps) {
		c := cps[p]
		out = append(out, Checkpoint{Partition: p, Epoch: c.Epoch, Position: c.Position})
	}
	return out
}

// Checkpoints returns From as a map by partition.
func (h Header) Checkpoints() map[int32]outbox.Checkpoint {
	m := make(map[int32]outbox.Checkpoint, len(h.From))
	for _, c := range h.From {
		m[c.Partition] = outbox.Checkpoint{Partition: c.Partition, Epoch: c.Epoch, Position: c.Position}
	}
	return m
}

func sortedPartitions(cps map[int32]outbox.Checkpoint) []int32 {
	return slices.Sorted(maps.Keys(cps))
}

// sameCheckpoints reports whether a and b hold the same epoch and position
// for every partition.
func sameCheckpoints(a, b map[int32]outbox.Checkpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for p, c := range a {
		o, ok := b[p]
		if !ok || o.Epoch != c.Epoch || o.Position != c.Position {
			return false
		}
	}
	return true
}

// describeCheckpoints is cps as a line: "[0] epoch E position P, ...".
func describeCheckpoints(cps map[int32]outbox.Checkpoint) string {
	if len(cps) == 0 {
		return "nothing (a new feed)"
	}
	s := ""
	for i, p := range sortedPartitions(cps) {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("[%d] epoch %s position %d", p, cps[p].Epoch, cps[p].Position)
	}
	return s
}

func encodeHeader(h Header) ([]byte, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode recording header: %w", err)
	}
	return b, nil
}

func decodeHeader(b []byte) (Header, error) {
	var h Header
	if err := json.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("%w: header: %v", ErrBadRecord, err)
	}
	switch {
	case h.Feed == "":
		return h, fmt.Errorf("%w: header names no feed", ErrBadRecord)
	case h.Part < 1:
		return h, fmt.Errorf("%w: header part %d", ErrBadRecord, h.Part)
	}
	return h, nil
}
