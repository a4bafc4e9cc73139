package recording

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
)

// DiffResult compares a replay's database with another (the live one, or
// another replay's) for the replayed deliveries' outputs and the
// processors' state tables.
type DiffResult struct {
	// Identical is true when every replayed delivery has the same outputs
	// in both and every state table holds the same rows.
	Identical bool `json:"identical"`
	// Deliveries counts the deliveries compared; Divergent those whose
	// outputs differ, MissingInDatabase those of them that have outputs in
	// the replay and none in the other database (which may have pruned
	// them: see --outbox-retention).
	Deliveries        int64 `json:"deliveries"`
	Divergent         int64 `json:"divergent"`
	MissingInDatabase int64 `json:"missingInDatabase"`
	// OutputsReplayed and OutputsDatabase count the outputs compared.
	OutputsReplayed int64 `json:"outputsReplayed"`
	OutputsDatabase int64 `json:"outputsDatabase"`
	// First is the first divergent delivery, in replay order.
	First *Divergence `json:"firstDivergence"`
	// Divergences lists every divergent delivery, in place order (by
	// partition, epoch and position), up to the listing's limit;
	// Unlisted counts those left out past it.
	Divergences []Divergence `json:"divergences"`
	Unlisted    int64        `json:"unlisted,omitempty"`
	// Topics counts the divergent deliveries by topic (a delivery counts
	// under each topic either side has an output on, "" for none).
	Topics map[string]int64 `json:"topics,omitempty"`
	// Tables compares each state table; DivergentTables counts those that
	// differ.
	Tables          []TableDiff `json:"tables"`
	DivergentTables int         `json:"divergentTables"`
	// Positions, when not "", says the two databases do not stand at the
	// same place of the feed: their state is compared as it is.
	Positions string `json:"positions,omitempty"`
}

// Divergence is a delivery whose outputs differ: Expected are the other
// database's, Got the replay's.
type Divergence struct {
	Partition int32    `json:"partition"`
	Epoch     string   `json:"epoch"`
	Position  int64    `json:"position"`
	Expected  []Output `json:"expected"`
	Got       []Output `json:"got"`
}

// Output is an output as a diff shows it (keys and values as text; nil
// for null).
type Output struct {
	Topic   string      `json:"topic"`
	Key     *string     `json:"key"`
	Value   *string     `json:"value"`
	Headers [][2]string `json:"headers,omitempty"`
}

// TableDiff compares one state table.
type TableDiff struct {
	Table string `json:"table"`
	// Rows counts each side's rows (of the feed, for a table with a feed
	// column); OnlyReplayed, OnlyDatabase and Differing the rows whose key
	// one side lacks or whose values differ.
	RowsReplayed int64 `json:"rowsReplayed"`
	RowsDatabase int64 `json:"rowsDatabase"`
	OnlyReplayed int64 `json:"onlyReplayed"`
	OnlyDatabase int64 `json:"onlyDatabase"`
	Differing    int64 `json:"differing"`
	// Missing says the table is only in one database ("replay" or
	// "database"); Columns that their columns differ.
	Missing string `json:"missing,omitempty"`
	Columns string `json:"columns,omitempty"`
	// FirstKey is the first divergent row's key, Expected and Got its rows
	// ("" for a side that lacks it).
	FirstKey string `json:"firstKey,omitempty"`
	Expected string `json:"expected,omitempty"`
	Got      string `json:"got,omitempty"`
	// Rows lists every divergent row in key order, up to the listing's
	// limit; Unlisted counts those left out past it.
	Rows     []RowDiff `json:"rows,omitempty"`
	Unlisted int64     `json:"unlisted,omitempty"`
	limit    int
}

// RowDiff is a state row that differs: its key, and each side's row (""
// for a side that lacks it).
type RowDiff struct {
	Key      string `json:"key"`
	Expected string `json:"expected"`
	Got      string `json:"got"`
}

// DefaultListed is how many divergent deliveries, and rows per table,
// Diff lists (every one is counted).
const DefaultListed = 1000

// Same reports whether the table is the same in both.
func (t TableDiff) Same() bool {
	return t.Missing == "" && t.Columns == "" && t.OnlyReplayed == 0 && t.OnlyDatabase == 0 && t.Differing == 0
}

// Diff compares the outputs of the deliveries at places (a replay's, see
// Summary.Places) in the replay's database with db's, by feed, partition,
// epoch, position and output index (topic, key, value and headers; not
// ids, times, or the dead-letter id header), and every state table, row by
// row (only feed's rows of a table with a feed column).
// It lists DefaultListed divergent deliveries and rows per table (see
// DiffListing).
func Diff(ctx context.Context, replayed, db *outbox.Store, feed string, places []Place) (DiffResult, error) {
	return DiffListing(ctx, replayed, db, feed, places, DefaultListed)
}

// DiffListing is Diff listing up to limit divergent deliveries, and limit
// divergent rows per table (0: none listed; every one is counted). A
// listed delivery holds its outputs, a row its values: the listing's size
// is about limit times the largest.
func DiffListing(ctx context.Context, replayed, db *outbox.Store, feed string, places []Place, limit int) (DiffResult, error) {
	var res DiffResult
	if err := diffOutputs(ctx, replayed, db, feed, places, &res, limit); err != nil {
		return res, err
	}
	if err := diffTables(ctx, replayed, db, feed, &res, limit); err != nil {
		return res, err
	}
	if err := diffPositions(ctx, replayed, db, feed, &res); err != nil {
		return res, err
	}
	res.Identical = res.Divergent == 0 && res.DivergentTables == 0
	return res, nil
}

// placeOrder orders places as the outbox query does.
func placeOrder(a, b Place) int {
	return cmp.Or(cmp.Compare(a.Partition, b.Partition), strings.Compare(a.Epoch, b.Epoch),
		cmp.Compare(a.Position, b.Position), cmp.Compare(a.Ordinal, b.Ordinal))
}

func rowPlace(r outbox.Row) Place {
	return Place{Partition: r.Partition, Epoch: r.Epoch, Position: r.Position}
}

func samePlace(a, b Place) bool {
	return a.Partition == b.Partition && a.Epoch == b.Epoch && a.Position == b.Position
}

func diffOutputs(ctx context.Context, replayed, db *outbox.Store, feed string, places []Place, res *DiffResult, limit int) error {
	ps := slices.Clone(places)
	slices.SortFunc(ps, placeOrder)
	// A place delivered twice (a dead letter requeued) is compared once,
	// with all its outputs.
	ps = slices.CompactFunc(ps, samePlace)
	a, err := openOutputs(ctx, replayed, feed)
	if err != nil {
		return err
	}
	defer a.c.Close()
	b, err := openOutputs(ctx, db, feed)
	if err != nil {
		return err
	}
	defer b.c.Close()
	first := int64(-1)
	for _, p := range ps {
		got, want := a.at(p), b.at(p)
		res.Deliveries++
		res.OutputsReplayed += int64(len(got))
		res.OutputsDatabase += int64(len(want))
		if sameOutputs(got, want) {
			continue
		}
		res.Divergent++
		if len(want) == 0 {
			res.MissingInDatabase++
		}
		countTopics(res, got, want)
		d := Divergence{Partition: p.Partition, Epoch: p.Epoch, Position: p.Position,
			Expected: showOutputs(want), Got: showOutputs(got)}
		if first < 0 || p.Ordinal < first {
			first = p.Ordinal
			res.First = &d
		}
		if len(res.Divergences) < limit {
			res.Divergences = append(res.Divergences, d)
		} else {
			res.Unlisted++
		}
	}
	return cmp.Or(a.c.Err(), b.c.Err())
}

// countTopics counts a divergent delivery under each topic its outputs
// are on, on either side.
func countTopics(res *DiffResult, got, want []outbox.Row) {
	if res.Topics == nil {
		res.Topics = map[string]int64{}
	}
	seen := map[string]bool{}
	for _, r := range slices.Concat(got, want) {
		if !seen[r.Topic] {
			seen[r.Topic] = true
			res.Topics[r.Topic]++
		}
	}
	if len(seen) == 0 {
		res.Topics[""]++
	}
}

// outputs walks one database's outputs in place order.
type outputs struct {
	c    *outbox.Cursor[outbox.Row]
	next *outbox.Row
}

func openOutputs(ctx context.Context, s *outbox.Store, feed string) (*outputs, error) {
	c, err := s.OutputsByPlace(ctx, feed)
	if err != nil {
		return nil, err
	}
	o := &outputs{c: c}
	o.advance()
	return o, nil
}

func (o *outputs) advance() {
	r, ok := o.c.Next()
	if ok {
		o.next = &r
	} else {
		o.next = nil
	}
}

// at returns the rows at p, skipping those before it.
func (o *outputs) at(p Place) []outbox.Row {
	for o.next != nil && placeOrder(rowPlace(*o.next), Place{Partition: p.Partition, Epoch: p.Epoch, Position: p.Position}) < 0 {
		o.advance()
	}
	var rows []outbox.Row
	for o.next != nil && samePlace(rowPlace(*o.next), p) {
		rows = append(rows, *o.next)
		o.advance()
	}
	return rows
}

func sameOutputs(a, b []outbox.Row) bool {
	return slices.EqualFunc(a, b, func(x, y outbox.Row) bool {
		return x.Topic == y.Topic && sameNullable(x.Key, y.Key) && sameNullable(x.Value, y.Value) &&
			slices.EqualFunc(comparedHeaders(x.Headers), comparedHeaders(y.Headers), func(h, k outbox.Header) bool {
				return h.Key == k.Key && bytes.Equal(h.Value, k.Value)
			})
	})
}

// sameNullable compares bytes, a null (nil) apart from an empty value.
func sameNullable(a, b []byte) bool {
	return (a == nil) == (b == nil) && bytes.Equal(a, b)
}

// comparedHeaders are a row's headers as compared: a dead letter's id is
// the database's own numbering, not the processor's decision.
func comparedHeaders(enc []byte) []outbox.Header {
	hs, err := outbox.DecodeHeaders(enc)
	if err != nil {
		return []outbox.Header{{Key: "(undecodable headers)", Value: enc}}
	}
	for i, h := range hs {
		if h.Key == ingest.HeaderDeadID {
			hs[i].Value = nil
		}
	}
	return hs
}

func showOutputs(rows []outbox.Row) []Output {
	out := make([]Output, 0, len(rows))
	for _, r := range rows {
		o := Output{Topic: r.Topic, Key: textOf(r.Key), Value: textOf(r.Value)}
		hs, _ := outbox.DecodeHeaders(r.Headers)
		for _, h := range hs {
			o.Headers = append(o.Headers, [2]string{h.Key, string(h.Value)})
		}
		out = append(out, o)
	}
	return out
}

func textOf(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

func diffTables(ctx context.Context, replayed, db *outbox.Store, feed string, res *DiffResult, limit int) error {
	ta, err := replayed.StateTables(ctx)
	if err != nil {
		return err
	}
	tb, err := db.StateTables(ctx)
	if err != nil {
		return err
	}
	byName := map[string][2]*outbox.StateTable{}
	for i := range ta {
		e := byName[ta[i].Name]
		e[0] = &ta[i]
		byName[ta[i].Name] = e
	}
	for i := range tb {
		e := byName[tb[i].Name]
		e[1] = &tb[i]
		byName[tb[i].Name] = e
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		pair := byName[name]
		td := TableDiff{Table: name, limit: limit}
		switch {
		case pair[1] == nil:
			td.Missing = "database"
		case pair[0] == nil:
			td.Missing = "replay"
		case !slices.Equal(pair[0].Columns, pair[1].Columns) || !slices.Equal(pair[0].Key, pair[1].Key):
			td.Columns = fmt.Sprintf("replay (%s), database (%s)", strings.Join(pair[0].Columns, ", "), strings.Join(pair[1].Columns, ", "))
		default:
			if err := diffTable(ctx, replayed, db, *pair[0], feed, &td); err != nil {
				return err
			}
		}
		if !td.Same() {
			res.DivergentTables++
		}
		res.Tables = append(res.Tables, td)
	}
	return nil
}

// diffTable merges the two tables' rows by key.
func diffTable(ctx context.Context, replayed, db *outbox.Store, t outbox.StateTable, feed string, td *TableDiff) error {
	ca, err := replayed.StateRows(ctx, t, feed)
	if err != nil {
		return err
	}
	defer ca.Close()
	cb, err := db.StateRows(ctx, t, feed)
	if err != nil {
		return err
	}
	defer cb.Close()
	keyIdx := make([]int, len(t.Key))
	for i, k := range t.Key {
		keyIdx[i] = slices.Index(t.Columns, k)
	}
	ra, okA := ca.Next()
	rb, okB := cb.Next()
	for okA || okB {
		c := 0
		switch {
		case !okA:
			c = 1
		case !okB:
			c = -1
		default:
			c = compareKeys(ra, rb, keyIdx)
		}
		switch {
		case c < 0:
			td.RowsReplayed++
			td.OnlyReplayed++
			td.first(t, keyIdx, ra, nil)
			ra, okA = ca.Next()
		case c > 0:
			td.RowsDatabase++
			td.OnlyDatabase++
			td.first(t, keyIdx, nil, rb)
			rb, okB = cb.Next()
		default:
			td.RowsReplayed++
			td.RowsDatabase++
			if !slices.EqualFunc(ra, rb, func(x, y any) bool { return compareValues(x, y) == 0 }) {
				td.Differing++
				td.first(t, keyIdx, ra, rb)
			}
			ra, okA = ca.Next()
			rb, okB = cb.Next()
		}
	}
	return cmp.Or(ca.Err(), cb.Err())
}

// first keeps a divergent row: the first, and the listed ones. got (the
// replay's) or want may be nil when that side lacks it.
func (td *TableDiff) first(t outbox.StateTable, keyIdx []int, got, want []any) {
	if td.FirstKey != "" && len(td.Rows) >= td.limit {
		td.Unlisted++
		return
	}
	row := got
	if row == nil {
		row = want
	}
	parts := make([]string, len(keyIdx))
	for i, k := range keyIdx {
		parts[i] = t.Columns[k] + "=" + showValue(row[k])
	}
	rd := RowDiff{Key: strings.Join(parts, ", "), Got: showRow(t.Columns, got), Expected: showRow(t.Columns, want)}
	if td.FirstKey == "" {
		td.FirstKey, td.Got, td.Expected = rd.Key, rd.Got, rd.Expected
	}
	if len(td.Rows) < td.limit {
		td.Rows = append(td.Rows, rd)
	} else {
		td.Unlisted++
	}
}

func showRow(cols []string, row []any) string {
	if row == nil {
		return ""
	}
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = c + "=" + showValue(row[i])
	}
	return strings.Join(parts, ", ")
}

func showValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case []byte:
		return fmt.Sprintf("%q", x)
	case string:
		return fmt.Sprintf("%q", x)
	}
	return fmt.Sprint(v)
}

func compareKeys(a, b []any, keyIdx []int) int {
	for _, i := range keyIdx {
		if c := compareValues(a[i], b[i]); c != 0 {
			return c
		}
	}
	return 0
}

// compareValues orders values as SQLite does: NULL, then numbers, then
// text (bytewise), then blobs (bytewise).
func compareValues(a, b any) int {
	ra, rb := valueRank(a), valueRank(b)
	if ra != rb {
		return cmp.Compare(ra, rb)
	}
	switch ra {
	case 0:
		return 0
	case 1:
		if x, ok := a.(int64); ok {
			if y, ok := b.(int64); ok {
				return cmp.Compare(x, y) // exactly: a float64 holds 53 bits
			}
		}
		return cmp.Compare(number(a), number(b))
	case 2:
		return strings.Compare(text(a), text(b))
	}
	return bytes.Compare(a.([]byte), b.([]byte))
}

func valueRank(v any) int {
	switch v.(type) {
	case nil:
		return 0
	case int64, float64, bool:
		return 1
	case string, time.Time:
		return 2
	}
	return 3
}

func number(v any) float64 {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case float64:
		return x
	case bool:
		if x {
			return 1
		}
	}
	return 0
}

func text(v any) string {
	if t, ok := v.(time.Time); ok {
		return t.UTC().Format(time.RFC3339Nano)
	}
	return v.(string)
}

func diffPositions(ctx context.Context, replayed, db *outbox.Store, feed string, res *DiffResult) error {
	pa, err := replayed.ReadPositions(ctx, feed)
	if err != nil {
		return err
	}
	pb, err := db.ReadPositions(ctx, feed)
	if err != nil {
		return err
	}
	ma, mb := map[int32]outbox.Checkpoint{}, map[int32]outbox.Checkpoint{}
	for _, c := range pa {
		ma[c.Partition] = c
	}
	for _, c := range pb {
		mb[c.Partition] = c
	}
	if !sameCheckpoints(ma, mb) {
		res.Positions = fmt.Sprintf("the replay stands at %s, the database at %s: their state is compared as it is",
			describeCheckpoints(ma), describeCheckpoints(mb))
	}
	return nil
}
