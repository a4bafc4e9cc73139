package sqlproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// Window makes a SQL processor aggregate in windows of event time, the
// engine keeping the watermark and closing each window once.
//
// Each item's event time (Time, Unix seconds) falls in the windows
// [start, start+Size) whose start is a multiple of Hop (Size unless set:
// tumbling windows; shorter: hopping windows, an item in Size/Hop of
// them). The watermark is the largest event time applied less Lateness,
// kept in outboxd's table processor_watermarks, written in the item's
// transaction with the feed's position. A window is open until the
// watermark reaches its end. apply runs once per open window of the item,
// with :window_start and :window_end (Unix seconds) bound; an item whose
// windows have all closed is late: a dead letter with reason "late", or
// only counted (processor_watermarks.late) when Late is "count". When an
// item moves the watermark past windows' ends, emit runs once per closed
// window that Table holds rows of (column window_start), in start order,
// with only :window_start and :window_end bound: its rows are the window's
// final result; then the window's rows are deleted from Table. All of it
// is in the item's transaction: a crash never emits a window twice nor
// forgets one. A window whose emit row is not an output is a dead letter
// of its own (reason bad-output, payload the window as JSON) and is
// deleted all the same.
//
// The watermark is the processor's, across the feeds and partitions it
// runs for.
type Window struct {
	// Time is an SQL expression over the item's parameters: its event
	// time in Unix seconds (unixepoch(:at)); a REAL is rounded down; NULL
	// or text makes the item malformed.
	Time string `yaml:"time" usage:"window: an SQL expression over the item's parameters, its event time in Unix seconds (unixepoch(:at))"`
	// Size is each window's length, whole seconds.
	Size time.Duration `yaml:"size" usage:"window: each window's length (1m), whole seconds"`
	// Hop is the distance between windows' starts: Size (tumbling) unless
	// set; shorter makes hopping windows.
	Hop time.Duration `yaml:"hop,omitempty" usage:"window: the distance between windows' starts, at most size (default size: tumbling windows)"`
	// Lateness is how far behind the largest event time seen an item may
	// come and still count: the watermark is that time less Lateness.
	Lateness time.Duration `yaml:"lateness,omitempty" usage:"window: the allowed lateness: the watermark is the largest event time seen less this"`
	// Late is LateDeadLetter (the default) or LateCount.
	Late string `yaml:"late,omitempty" usage:"window: what a late item (all its windows closed) becomes: dead-letter (the default) or count"`
	// Table is the table holding the windows' state, by its column
	// window_start: a closed window's rows are deleted after its result
	// is emitted.
	Table string `yaml:"table" usage:"window: the table of the windows' state, with a column window_start; a closed window's rows are deleted once emitted"`
}

// What a late item becomes.
const (
	LateDeadLetter = "dead-letter"
	LateCount      = "count"
)

// ReasonLate is the dead letter of an item whose windows had all closed.
const ReasonLate = "late"

// The parameters of a windowed processor's apply and emit statements.
const (
	ParamWindowStart = "window_start"
	ParamWindowEnd   = "window_end"
)

// maxWindowsPerItem bounds Size/Hop: the windows one item counts in.
const maxWindowsPerItem = 1024

// windowPlan is a Window checked.
type windowPlan struct {
	cfg                  Window
	time                 *statement
	size, hop, lateness  int64  // seconds
	table                string // quoted
	slotStart, slotEnd   int    // the window parameters' slots
	read, write, lateInc *outbox.Statement
	closed, compact      *outbox.Statement
}

func (c Config) windowPlan(p *plan, itemParams []string) (*windowPlan, error) {
	w := &c.Window
	fail := func(format string, args ...any) error {
		return fmt.Errorf("sqlproc %s: window: %s", c.Name, fmt.Sprintf(format, args...))
	}
	secs := func(name string, d time.Duration, zero bool) (int64, error) {
		switch {
		case d < 0 || d == 0 && !zero:
			return 0, fail("%s %v: want a positive duration", name, d)
		case d%time.Second != 0:
			return 0, fail("%s %v: want whole seconds", name, d)
		}
		return int64(d / time.Second), nil
	}
	wp := &windowPlan{cfg: *w, slotStart: len(p.params) - 2, slotEnd: len(p.params) - 1}
	var err error
	if strings.TrimSpace(w.Time) == "" {
		return nil, fail("time: missing: an SQL expression giving the item's event time in Unix seconds")
	}
	if wp.time, err = c.single("window.time", "SELECT ("+w.Time+")", itemParams); err != nil {
		return nil, err
	}
	if wp.time == nil {
		return nil, fail("time: missing")
	}
	if wp.size, err = secs("size", w.Size, false); err != nil {
		return nil, err
	}
	wp.hop = wp.size
	if w.Hop != 0 {
		if wp.hop, err = secs("hop", w.Hop, false); err != nil {
			return nil, err
		}
	}
	if wp.hop > wp.size {
		return nil, fail("hop %v is longer than size %v: items between windows would count nowhere", w.Hop, w.Size)
	}
	if wp.size/wp.hop > maxWindowsPerItem {
		return nil, fail("size %v over hop %v puts an item in %d windows, more than %d", w.Size, w.Hop, wp.size/wp.hop, maxWindowsPerItem)
	}
	if wp.lateness, err = secs("lateness", w.Lateness, true); err != nil {
		return nil, err
	}
	switch w.Late {
	case "", LateDeadLetter, LateCount:
	default:
		return nil, fail("late: %q is not one of %s, %s", w.Late, LateDeadLetter, LateCount)
	}
	if !isTableName(w.Table) {
		return nil, fail("table %q: want the name of the table holding the windows' state (letters, digits, _)", w.Table)
	}
	wp.table = `"` + w.Table + `"`
	wp.read = outbox.NewStatement(`SELECT max_event_time FROM processor_watermarks WHERE processor = ?1`)
	wp.write = outbox.NewStatement(`INSERT INTO processor_watermarks (processor, max_event_time) VALUES (?1, ?2)
ON CONFLICT (processor) DO UPDATE SET max_event_time = excluded.max_event_time`)
	wp.lateInc = outbox.NewStatement(`UPDATE processor_watermarks SET late = late + 1 WHERE processor = ?1`)
	wp.closed = outbox.NewStatement(`SELECT DISTINCT window_start FROM ` + wp.table + ` WHERE window_start <= ?1 ORDER BY window_start`)
	wp.compact = outbox.NewStatement(`DELETE FROM ` + wp.table + ` WHERE window_start = ?1`)
	return wp, nil
}

func isTableName(n string) bool {
	return n != "" && isParamName(n) || n != "" && n[0] == '_' && isParamName("x"+n)
}

// checkWindowTable makes sure the window's table exists, with a column
// window_start, in s as the setup left it.
func (p *plan) checkWindowTable(ctx context.Context, s *outbox.Store) error {
	if p.window == nil {
		return nil
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		return fmt.Errorf("sqlproc %s: %w", p.cfg.Name, err)
	}
	defer tx.Rollback()
	return p.window.checkTable(ctx, tx, p.cfg.Name)
}

func (w *windowPlan) checkTable(ctx context.Context, tx *outbox.Tx, name string) error {
	var cols []string
	if err := tx.Select(ctx, &cols, `SELECT name FROM pragma_table_info(?)`, w.cfg.Table); err != nil {
		return fmt.Errorf("sqlproc %s: window: table %s: %w", name, w.cfg.Table, err)
	}
	switch {
	case len(cols) == 0:
		return fmt.Errorf("sqlproc %s: window: table %s: no such table (setup makes it)", name, w.cfg.Table)
	case !containsFold(cols, ParamWindowStart):
		return fmt.Errorf("sqlproc %s: window: table %s has no column window_start (its columns: %s)", name, w.cfg.Table, strings.Join(cols, ", "))
	}
	return nil
}

func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// floorDiv is a/b rounded down (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// badWindow is a closed window whose result is not an output.
type badWindow struct {
	start, end int64
	err        error
}

// runWindowed runs a windowed processor's item after its reject: its
// event time, apply once per open window, the watermark, and the windows
// it closes.
func (p *Processor) runWindowed(ctx context.Context, tx *outbox.Tx, b *outbox.Batch, s *itemState) error {
	w := p.plan.window
	t, err := p.eventTime(ctx, b, s)
	if err != nil || s.verdict != nil {
		return err
	}
	s.failed = nil
	old, seen, err := p.watermark(ctx, b)
	if err != nil {
		return err
	}
	newMax := t
	if seen && old > t {
		newMax = old
	}
	wm := newMax - w.lateness
	opened := 0
	for k := floorDiv(t-w.size, w.hop) + 1; k <= floorDiv(t, w.hop); k++ {
		start := k * w.hop
		if start+w.size <= wm {
			continue // closed
		}
		opened++
		s.vals[w.slotStart], s.vals[w.slotEnd] = start, start+w.size
		for i := range p.apply {
			r := &p.apply[i]
			s.failed = r
			if err := b.Exec(ctx, r.stmt, s.args(r)...); err != nil {
				return err
			}
		}
	}
	s.failed = nil
	if opened == 0 {
		if w.cfg.Late == LateCount {
			return b.Exec(ctx, w.lateInc, p.Name())
		}
		s.verdict = ingest.Permanent(ReasonLate, fmt.Errorf("event time %s is behind the watermark %s (the largest event time seen, %s, less the lateness %v): its windows have closed",
			unixText(t), unixText(wm), unixText(old), w.cfg.Lateness))
		return nil
	}
	if seen && newMax <= old {
		return nil
	}
	if err := b.Exec(ctx, w.write, p.Name(), newMax); err != nil {
		return err
	}
	// Windows end at k*hop+size: some closed if the watermark passed one.
	if seen && floorDiv(wm-w.size, w.hop) == floorDiv(old-w.lateness-w.size, w.hop) {
		return nil
	}
	return p.closeWindows(ctx, tx, b, s, wm-w.size)
}

// eventTime is the item's event time; a NULL or a text sets the item's
// verdict (malformed).
func (p *Processor) eventTime(ctx context.Context, b *outbox.Batch, s *itemState) (int64, error) {
	rows, err := p.query(ctx, b, s, p.wtime)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	ok, err := s.next(rows)
	if !ok {
		if err == nil {
			err = errors.New("window.time returned no row")
		}
		return 0, err
	}
	switch v := s.row[0].(type) {
	case int64:
		return v, nil
	case float64:
		if !math.IsNaN(v) && v >= math.MinInt64 && v < math.MaxInt64 {
			return int64(math.Floor(v)), nil
		}
	case nil:
		s.verdict = ingest.Permanent(ingest.ReasonMalformed, errors.New("window time is NULL: the item has no event time"))
		return 0, nil
	}
	s.cells[0].v = s.row[0]
	s.verdict = ingest.Permanent(ingest.ReasonMalformed, fmt.Errorf("window time %q is not a number of Unix seconds", clip(s.cells[0].text(), 64)))
	return 0, nil
}

// watermark reads the largest event time applied, seen false when none.
func (p *Processor) watermark(ctx context.Context, b *outbox.Batch) (max int64, seen bool, err error) {
	rows, err := b.Query(ctx, p.plan.window.read, p.Name())
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	ok, err := rows.Next()
	if !ok {
		return 0, false, err
	}
	v, _ := rows.Values()[0].(int64)
	return v, true, nil
}

// closeWindows emits the final result of every window of the table whose
// start is at most last, in start order, and deletes its rows.
func (p *Processor) closeWindows(ctx context.Context, tx *outbox.Tx, b *outbox.Batch, s *itemState, last int64) error {
	w := p.plan.window
	rows, err := b.Query(ctx, w.closed, last)
	if err != nil {
		return err
	}
	var starts []int64
	for {
		ok, err := rows.Next()
		if err != nil {
			rows.Close()
			return err
		}
		if !ok {
			break
		}
		if v, isInt := rows.Values()[0].(int64); isInt {
			starts = append(starts, v)
		}
	}
	rows.Close()
	for _, start := range starts {
		s.vals[w.slotStart], s.vals[w.slotEnd] = start, start+w.size
		if err := p.emitWindow(ctx, tx, b, s, start); err != nil {
			return err
		}
		s.failed = nil
		if err := b.Exec(ctx, w.compact, start); err != nil {
			return err
		}
	}
	return nil
}

// emitWindow runs emit for the window bound in s: every row an output, or
// none and the window a dead letter (s.bad).
func (p *Processor) emitWindow(ctx context.Context, tx *outbox.Tx, b *outbox.Batch, s *itemState, start int64) error {
	if p.emit == nil {
		return nil
	}
	rows, err := p.query(ctx, b, s, p.emit)
	if err != nil {
		return err
	}
	defer rows.Close()
	end := start + p.plan.window.size
	if err := s.emitDest(rows.Columns()); err != nil {
		s.bad = append(s.bad, badWindow{start, end, fmt.Errorf("%s: %w", p.emit.name, err)})
		return nil
	}
	var outs []outbox.Output
	for n := 0; ; n++ {
		ok, err := s.next(rows)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		s.fill()
		o, err := s.output(p.plan.cfg.Topic)
		if err != nil {
			s.bad = append(s.bad, badWindow{start, end, fmt.Errorf("%s: row %d: %w", p.emit.name, n+1, err)})
			return nil
		}
		outs = append(outs, outbox.Output{Topic: o.Topic, Key: clone(o.Key), Value: clone(o.Value), Headers: cloneHeaders(o.Headers)})
	}
	for _, o := range outs {
		if err := tx.Emit(ctx, o); err != nil {
			s.verdict = err
			return nil
		}
	}
	return nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

func cloneHeaders(hs []outbox.Header) []outbox.Header {
	if hs == nil {
		return nil
	}
	out := make([]outbox.Header, len(hs))
	for i, h := range hs {
		out[i] = outbox.Header{Key: h.Key, Value: clone(h.Value)}
	}
	return out
}

// deadWindows stores the windows of s.bad as dead letters of their own,
// at the place of the item that closed them.
func (p *Processor) deadWindows(ctx context.Context, tx *outbox.Tx, d ingest.Delivery, s *itemState) error {
	for _, bw := range s.bad {
		payload, _ := json.Marshal(map[string]any{"processor": p.Name(), "window_start": bw.start, "window_end": bw.end})
		_, err := tx.DeadLetter(ctx, outbox.DeadLetter{
			Feed: d.Feed, Partition: d.Partition, Epoch: d.Epoch, Position: d.Position, Sequence: d.Sequence,
			Attempts: d.Attempt, Reason: ReasonBadOutput, Payload: payload,
			Error: fmt.Sprintf("window [%s, %s): %v", unixText(bw.start), unixText(bw.end), bw.err),
		})
		if err != nil {
			return fmt.Errorf("sqlproc %s: %w", p.Name(), err)
		}
	}
	return nil
}

// unixText is Unix seconds as RFC 3339 UTC.
func unixText(t int64) string { return time.Unix(t, 0).UTC().Format(time.RFC3339) }
