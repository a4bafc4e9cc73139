package devkafka

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The dev broker dies with the server that hosts it, kill -9 included. kfake
// ends a transaction by writing its marker to each of the transaction's
// partitions in turn and logs the decision only after the last one, and on
// recovery it aborts every transaction a partition holds no marker for. A
// kill between two markers so leaves a transaction committed on some
// partitions and aborted on the others: a relay's progress record lost while
// its outputs stand, which the relay then publishes again.
//
// A real coordinator logs its decision (PrepareCommit, PrepareAbort) to its
// transaction log before it writes any marker, and on recovery completes
// every prepared transaction on all its partitions. The dev broker does the
// same beside kfake: it writes each EndTxn's decision, with the offset where
// the marker goes on each partition the transaction wrote to, to decisions.log
// (synced) before kfake writes a marker, and before kfake loads the data
// directory it writes the markers the last decision still lacks
// (recoverTxns). A transaction with no decision logged has no marker
// anywhere and is aborted on every partition, as kfake already does.
//
// Running the broker as a process of its own would not do: it still dies on a
// reboot or an OOM kill, and the next start leaves the same half-ended
// transaction behind; the recovery makes the log on disk consistent whatever
// stopped the broker.

// decisionsFile is the dev broker's transaction log in its data directory.
const decisionsFile = "outboxd-txn-decisions.log"

// decisionsLogMax is the size past which the log starts over at the next
// decision: every decision before that one is complete on disk by then (kfake
// handles requests one at a time), so only the newest one is ever needed.
var decisionsLogMax int64 = 1 << 20

// decision is one logged EndTxn: the producer, its epoch, commit or abort,
// and where the marker goes on each partition the transaction wrote to (each
// partition's end offset when the decision was taken).
type decision struct {
	TxnID  string         `json:"txn"`
	PID    int64          `json:"pid"`
	Epoch  int16          `json:"epoch"`
	Commit bool           `json:"commit"`
	Parts  []decisionPart `json:"parts"`
}

// decisionPart is a partition of a decided transaction and the offset its
// marker takes.
type decisionPart struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Marker    int64  `json:"marker"`
}

type topicPartition struct {
	topic     string
	partition int32
}

// txnLog is the dev broker's transaction log: the partitions each
// transactional id has produced to since its last decision, and the
// decisions file. Its methods run in kfake's control functions, one at a
// time; the mutex guards against Close.
type txnLog struct {
	mu      sync.Mutex
	f       *os.File
	size    int64
	parts   map[string]map[topicPartition]bool
	decided map[string]bool // decided since its last produce: the next produce starts a transaction
	names   map[[16]byte]string
	logger  *slog.Logger
}

// openTxnLog opens (creates) the decisions log in dir, empty: recoverTxns has
// completed what it held.
func openTxnLog(dir string, logger *slog.Logger) (*txnLog, error) {
	f, err := os.OpenFile(filepath.Join(dir, decisionsFile), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open transaction log: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("sync transaction log: %w", err)
	}
	return &txnLog{f: f, parts: map[string]map[topicPartition]bool{}, decided: map[string]bool{}, names: map[[16]byte]string{}, logger: logger}, nil
}

// install makes c log its decisions through l: it follows the partitions
// of every transactional produce and logs each EndTxn before kfake handles
// it. Neither control function answers a request.
func (l *txnLog) install(c *kfake.Cluster) {
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		l.produced(req.(*kmsg.ProduceRequest), func(id [16]byte) string {
			if ti := c.TopicIDInfo(id); ti != nil {
				return ti.Topic
			}
			return ""
		})
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.EndTxnRequest)
		if err := l.decide(r, func(topic string, p int32) (int64, bool) {
			if pi := c.PartitionInfo(topic, p); pi != nil {
				return pi.HighWatermark, true
			}
			return 0, false
		}); err != nil {
			// Unlogged, the decision would be lost with a crash
			// in the middle of its markers: refuse it, the
			// producer retries.
			l.logger.Error("dev broker: log a transaction's end", "err", err)
			resp := r.ResponseKind().(*kmsg.EndTxnResponse)
			resp.ErrorCode = kerr.CoordinatorNotAvailable.Code // retriable
			return resp, nil, true
		}
		return nil, nil, false
	})
}

// produced notes the partitions a transactional produce writes to; name
// gives the name of a topic a request names by its ID (produce v13).
func (l *txnLog) produced(r *kmsg.ProduceRequest, name func([16]byte) string) {
	if r.TransactionID == nil {
		return
	}
	id := *r.TransactionID
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.decided[id] || l.parts[id] == nil {
		l.parts[id] = map[topicPartition]bool{}
		delete(l.decided, id)
	}
	for _, t := range r.Topics {
		topic := t.Topic
		if topic == "" {
			if topic = l.names[t.TopicID]; topic == "" {
				topic = name(t.TopicID)
				l.names[t.TopicID] = topic
			}
		}
		for _, p := range t.Partitions {
			l.parts[id][topicPartition{topic, p.Partition}] = true
		}
	}
}

// decide logs r's decision and syncs it; end gives a partition's end offset.
func (l *txnLog) decide(r *kmsg.EndTxnRequest, end func(string, int32) (int64, bool)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return errors.New("transaction log closed")
	}
	d := decision{TxnID: r.TransactionalID, PID: r.ProducerID, Epoch: r.ProducerEpoch, Commit: r.Commit}
	for tp := range l.parts[r.TransactionalID] {
		if off, ok := end(tp.topic, tp.partition); ok {
			d.Parts = append(d.Parts, decisionPart{Topic: tp.topic, Partition: tp.partition, Marker: off})
		}
	}
	// A retried EndTxn (its answer lost) finds the same partitions: the
	// set is kept until the next produce of the id.
	l.decided[r.TransactionalID] = true
	if len(d.Parts) == 0 {
		return nil // no marker of it can be missing
	}
	if l.size > decisionsLogMax {
		if err := l.f.Truncate(0); err != nil {
			return fmt.Errorf("truncate transaction log: %w", err)
		}
		l.size = 0
	}
	frame, err := encodeDecision(d)
	if err != nil {
		return err
	}
	if _, err := l.f.WriteAt(frame, l.size); err != nil {
		return fmt.Errorf("write transaction log: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("sync transaction log: %w", err)
	}
	l.size += int64(len(frame))
	return nil
}

// close closes the log file.
func (l *txnLog) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeDecision frames d: length (4 bytes), CRC-32C of the JSON (4 bytes),
// then the JSON; all little-endian.
func encodeDecision(d decision) ([]byte, error) {
	js, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode decision: %w", err)
	}
	frame := make([]byte, 8, 8+len(js))
	binary.LittleEndian.PutUint32(frame[0:4], uint32(len(js)))
	binary.LittleEndian.PutUint32(frame[4:8], crc32.Checksum(js, castagnoli))
	return append(frame, js...), nil
}

// lastDecision reads the newest whole decision of the log at path; a torn
// frame at its end (a crash while writing it, before kfake wrote any of its
// markers) is not one. ok is false when there is none.
func lastDecision(path string) (d decision, ok bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return d, false, nil
	}
	if err != nil {
		return d, false, fmt.Errorf("open transaction log: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(f)
	if err != nil {
		return d, false, fmt.Errorf("read transaction log: %w", err)
	}
	for len(raw) >= 8 {
		n := int(binary.LittleEndian.Uint32(raw[0:4]))
		if n > len(raw)-8 {
			break
		}
		js := raw[8 : 8+n]
		if crc32.Checksum(js, castagnoli) != binary.LittleEndian.Uint32(raw[4:8]) {
			break
		}
		var next decision
		if err := json.Unmarshal(js, &next); err != nil {
			break
		}
		d, ok = next, true
		raw = raw[8+n:]
	}
	return d, ok, nil
}
