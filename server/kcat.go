package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Output formats of the consume command.
const (
	consumeText = "text" // one line per record: partition, offset, key, value, headers
	consumeJSON = "json" // one consumedRecord object per line
)

// errTopicNotFound is the consume command's error for a topic the brokers
// do not have.
var errTopicNotFound = errors.New("topic not found")

// consumeOptions say what the consume command reads and how it writes it.
type consumeOptions struct {
	Brokers []string
	Topic   string
	// Offset is where each partition is read from: beginning, end, N (the
	// offset N) or -N (the last N offsets before the end).
	Offset string
	// Partition is the one partition read; -1: every partition.
	Partition int
	// Count stops after this many records (0: no limit).
	Count int64
	// UntilEnd stops once every partition read has been read up to its
	// end as it was at the start (its last stable offset: what a
	// read_committed consumer can see then).
	UntilEnd bool
	// Format is consumeText or consumeJSON; FormatString, when set, is a
	// kcat-like format instead (formatRecord).
	Format       string
	FormatString string
	// ConnectTimeout bounds the wait for the brokers' first answer.
	ConnectTimeout time.Duration
	// ClientOpts are added to the client's options (TLS, SASL).
	ClientOpts []kgo.Opt
}

// startOffset is a parsed consumeOptions.Offset.
type startOffset struct {
	kind string // "beginning", "end", "at", "last"
	n    int64
}

// parseOffset reads beginning|end|N|-N.
func parseOffset(s string) (startOffset, error) {
	switch s {
	case "beginning", "start", "":
		return startOffset{kind: "beginning"}, nil
	case "end":
		return startOffset{kind: "end"}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		return startOffset{}, fmt.Errorf("-o %q: want beginning, end, an offset N or -N (the last N)", s)
	case n < 0:
		return startOffset{kind: "last", n: -n}, nil
	}
	return startOffset{kind: "at", n: n}, nil
}

// from is the offset a partition holding [start, end) is read from.
func (o startOffset) from(start, end int64) int64 {
	switch o.kind {
	case "beginning":
		return start
	case "end":
		return end
	case "last":
		return max(start, end-o.n)
	}
	return min(max(start, o.n), end) // past the end: the end, where new records come
}

// consumedRecord is one record as `consume --format json` writes it.
type consumedRecord struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Timestamp is the record's, RFC 3339 in UTC with milliseconds.
	Timestamp string `json:"timestamp"`
	// Key and Value are the record's bytes as a string (invalid UTF-8
	// shows as U+FFFD); nil when the record has none.
	Key     *string          `json:"key"`
	Value   *string          `json:"value"`
	Headers []consumedHeader `json:"headers"`
}

// consumedHeader is one record header, in the record's order.
type consumedHeader struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// consumeTopic reads a topic with read_committed isolation and writes each
// record to w as it arrives. It returns the number of records written. It
// runs until ctx is done (then it returns nil), until Count records, or,
// with UntilEnd, until it has read every partition to the end it had when
// it started. It returns an error within ConnectTimeout when no broker
// answers or the topic (or the partition) does not exist.
func consumeTopic(ctx context.Context, o consumeOptions, w io.Writer) (int64, error) {
	at, err := parseOffset(o.Offset)
	if err != nil {
		return 0, err
	}
	parts, err := partitionRanges(ctx, o)
	if err != nil {
		return 0, err
	}
	assign := map[int32]kgo.Offset{}
	left := map[int32]int64{}
	for p, r := range parts {
		from := at.from(r[0], r[1])
		assign[p] = kgo.NewOffset().At(from)
		if from < r[1] {
			left[p] = r[1]
		}
	}
	if o.UntilEnd && len(left) == 0 {
		return 0, nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{o.Topic: assign}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers take offsets too: seeing them tells when a
		// partition has been read to its end.
		kgo.KeepControlRecords(),
	}, o.ClientOpts...)...)
	if err != nil {
		return 0, fmt.Errorf("consume %s: %w", o.Topic, err)
	}
	defer cl.Close()
	c := &consumer{o: o, w: bufio.NewWriter(w), left: left}
	return c.run(ctx, cl)
}

// partitionRanges checks that the brokers answer and the topic exists, and
// returns each partition read with its start offset and last stable
// offset.
func partitionRanges(ctx context.Context, o consumeOptions) (map[int32][2]int64, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(o.Brokers...)}, o.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", o.Topic, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	mctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	brokers := strings.Join(o.Brokers, ",")
	md, err := adm.Metadata(mctx, o.Topic)
	if err != nil {
		if mctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("consume %s: no broker of %s answered within %v", o.Topic, brokers, o.ConnectTimeout)
		}
		return nil, fmt.Errorf("consume %s: no broker of %s answered: %w", o.Topic, brokers, err)
	}
	td, ok := md.Topics[o.Topic]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("consume %s: %w on %s", o.Topic, errTopicNotFound, brokers)
	}
	if td.Err != nil {
		return nil, fmt.Errorf("consume %s: %w", o.Topic, td.Err)
	}
	if o.Partition >= 0 {
		if _, ok := td.Partitions[int32(o.Partition)]; !ok {
			return nil, fmt.Errorf("consume %s: no partition %d (the topic has %d)", o.Topic, o.Partition, len(td.Partitions))
		}
	}
	starts, err := adm.ListStartOffsets(mctx, o.Topic)
	if err != nil {
		return nil, fmt.Errorf("consume %s: start offsets: %w", o.Topic, err)
	}
	ends, err := adm.ListCommittedOffsets(mctx, o.Topic)
	if err != nil {
		return nil, fmt.Errorf("consume %s: end offsets: %w", o.Topic, err)
	}
	out := map[int32][2]int64{}
	for p := range td.Partitions {
		if o.Partition >= 0 && p != int32(o.Partition) {
			continue
		}
		s, sok := starts.Lookup(o.Topic, p)
		e, eok := ends.Lookup(o.Topic, p)
		switch {
		case !sok || !eok:
			return nil, fmt.Errorf("consume %s: no offsets of partition %d", o.Topic, p)
		case s.Err != nil:
			return nil, fmt.Errorf("consume %s: start offset of partition %d: %w", o.Topic, p, s.Err)
		case e.Err != nil:
			return nil, fmt.Errorf("consume %s: end offset of partition %d: %w", o.Topic, p, e.Err)
		}
		out[p] = [2]int64{s.Offset, e.Offset}
	}
	return out, nil
}

// consumer is one consumeTopic call's progress.
type consumer struct {
	o    consumeOptions
	w    *bufio.Writer
	n    int64
	left map[int32]int64 // UntilEnd: per partition still to read, the end to reach
}

func (c *consumer) run(ctx context.Context, cl *kgo.Client) (int64, error) {
	for !c.o.UntilEnd || len(c.left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return c.n, c.w.Flush()
		}
		if err := fetchError(fs); err != nil {
			return c.n, fmt.Errorf("consume %s: %w", c.o.Topic, err)
		}
		var werr error
		fs.EachRecord(func(r *kgo.Record) {
			if werr == nil && !c.full() {
				werr = c.record(r)
			}
		})
		if werr == nil {
			werr = c.w.Flush()
		}
		if werr != nil {
			return c.n, fmt.Errorf("consume %s: write: %w", c.o.Topic, werr)
		}
		if c.full() {
			break
		}
	}
	return c.n, nil
}

// full says the count of records asked for is written.
func (c *consumer) full() bool { return c.o.Count > 0 && c.n >= c.o.Count }

// record writes r unless it is a transaction marker (or, with UntilEnd,
// past its partition's end), and notes how far its partition has been read.
func (c *consumer) record(r *kgo.Record) error {
	end, open := c.left[r.Partition]
	if open && r.Offset+1 >= end {
		delete(c.left, r.Partition)
	}
	if r.Attrs.IsControl() || (c.o.UntilEnd && (!open || r.Offset >= end)) {
		return nil
	}
	c.n++
	switch {
	case c.o.FormatString != "":
		_, err := c.w.WriteString(formatRecord(c.o.FormatString, r))
		return err
	case c.o.Format == consumeJSON:
		b, err := json.Marshal(consumedOf(r))
		if err != nil {
			return err
		}
		c.w.Write(b)
		return c.w.WriteByte('\n')
	}
	_, err := c.w.WriteString(textLine(r))
	return err
}

// fetchError returns the first error worth stopping for: not a retriable
// one, which the client retries by itself.
func fetchError(fs kgo.Fetches) error {
	for _, fe := range fs.Errors() {
		switch {
		case errors.Is(fe.Err, context.Canceled), errors.Is(fe.Err, context.DeadlineExceeded),
			kerr.IsRetriable(fe.Err):
			continue
		}
		return fe.Err
	}
	return nil
}

// timestamp is a record's time as the output shows it.
func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

func consumedOf(r *kgo.Record) consumedRecord {
	c := consumedRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: timestamp(r.Timestamp),
		Key: bytesPtr(r.Key), Value: bytesPtr(r.Value), Headers: make([]consumedHeader, 0, len(r.Headers))}
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, consumedHeader{Key: h.Key, Value: string(h.Value)})
	}
	return c
}

// textLine is one record for people: "partition offset key value", then
// the headers; a missing key or value shows as "-", a string with tabs,
// line breaks or bytes that are not UTF-8 is quoted.
func textLine(r *kgo.Record) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(int64(r.Partition), 10))
	b.WriteByte('\t')
	b.WriteString(strconv.FormatInt(r.Offset, 10))
	b.WriteByte('\t')
	b.WriteString(textField(r.Key))
	b.WriteByte('\t')
	b.WriteString(textField(r.Value))
	if len(r.Headers) > 0 {
		b.WriteByte('\t')
		b.WriteString(headerText(r.Headers))
	}
	b.WriteByte('\n')
	return b.String()
}

func textField(v []byte) string {
	if v == nil {
		return "-"
	}
	s := string(v)
	if s == "" || s == "-" || strings.ContainsAny(s, "\t\n\r") || !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	return s
}

// headerText is the headers as KEY=VALUE separated by spaces, each key
// and value quoted (Go syntax) when it is empty or holds a space, '=',
// ',', a quote or a byte that is not printable UTF-8, so that a value
// with spaces reads back as one.
func headerText(hs []kgo.RecordHeader) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = headerField(h.Key) + "=" + headerField(string(h.Value))
	}
	return strings.Join(parts, " ")
}

func headerField(s string) string {
	if s == "" || !utf8.ValidString(s) || strings.ContainsAny(s, " =,\"\\") ||
		strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// formatRecord writes r in the kcat-like format f: %t topic, %p
// partition, %o offset, %k key, %s value, %h headers (as headerText), %T
// timestamp (milliseconds since the epoch), %K and %S the key's and the
// value's length in bytes (-1 for none), %% a percent sign; \n, \t, \r
// and \\ are escapes. A missing key or value prints as nothing.
func formatRecord(f string, r *kgo.Record) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		ch := f[i]
		if i+1 >= len(f) || (ch != '%' && ch != '\\') {
			b.WriteByte(ch)
			continue
		}
		i++
		if ch == '\\' {
			switch f[i] {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '\\':
				b.WriteByte('\\')
			default:
				b.WriteByte('\\')
				b.WriteByte(f[i])
			}
			continue
		}
		switch f[i] {
		case 't':
			b.WriteString(r.Topic)
		case 'p':
			b.WriteString(strconv.FormatInt(int64(r.Partition), 10))
		case 'o':
			b.WriteString(strconv.FormatInt(r.Offset, 10))
		case 'k':
			b.Write(r.Key)
		case 's':
			b.Write(r.Value)
		case 'h':
			b.WriteString(headerText(r.Headers))
		case 'T':
			b.WriteString(strconv.FormatInt(r.Timestamp.UnixMilli(), 10))
		case 'K':
			b.WriteString(strconv.Itoa(byteLen(r.Key)))
		case 'S':
			b.WriteString(strconv.Itoa(byteLen(r.Value)))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

// checkFormatString reports a % directive formatRecord does not know.
func checkFormatString(f string) error {
	for i := 0; i+1 < len(f); i++ {
		if f[i] == '\\' {
			i++
			continue
		}
		if f[i] != '%' {
			continue
		}
		i++
		if !slices.Contains([]byte("tpoksTKSh%"), f[i]) {
			return fmt.Errorf("-f %q: unknown %%%c (want %%t %%p %%o %%k %%s %%h %%T %%K %%S or %%%%)", f, f[i])
		}
	}
	return nil
}

func byteLen(b []byte) int {
	if b == nil {
		return -1
	}
	return len(b)
}

func bytesPtr(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}
