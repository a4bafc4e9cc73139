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

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/clock"
	"github.com/outboxd/outboxd/internal/kafka"
	"github.com/outboxd/outboxd/internal/kafkasec"
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
	// Kafka is how to connect (TLS, SASL).
	Kafka kafkasec.Settings
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

// record is a record as the consume command shows it.
type record struct {
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time
	Key       []byte
	Value     []byte
	Headers   []header
	control   bool // a transaction marker: never shown
}

// header is a record header.
type header struct {
	Key   string
	Value []byte
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
	cl, err := kafka.New(o.Brokers, "outboxd-consume", o.Kafka)
	if err != nil {
		return 0, fmt.Errorf("consume %s: %w", o.Topic, err)
	}
	defer cl.Close()
	parts, err := partitionRanges(ctx, cl, o)
	if err != nil {
		return 0, err
	}
	c := &consumer{o: o, cl: cl, w: bufio.NewWriter(w), left: map[int32]int64{}}
	for _, p := range parts {
		from := at.from(p.start, p.end)
		c.parts = append(c.parts, &consumed{id: p.id, leader: p.leader, at: from})
		if from < p.end {
			c.left[p.id] = p.end
		}
	}
	if o.UntilEnd && len(c.left) == 0 {
		return 0, nil
	}
	return c.run(ctx)
}

// partRange is a partition to read: its leader, start offset and last
// stable offset at the start.
type partRange struct {
	id, leader int32
	start, end int64
}

// partitionRanges checks that the brokers answer and the topic exists, and
// returns each partition read with its start offset and last stable
// offset, by partition.
func partitionRanges(ctx context.Context, cl *kafka.Client, o consumeOptions) ([]partRange, error) {
	mctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	brokers := strings.Join(o.Brokers, ",")
	md, err := cl.Metadata(mctx, []string{o.Topic}, false)
	if err != nil {
		if mctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("consume %s: no broker of %s answered within %v", o.Topic, brokers, o.ConnectTimeout)
		}
		return nil, fmt.Errorf("consume %s: no broker of %s answered: %w", o.Topic, brokers, err)
	}
	td, ok := md[o.Topic]
	if !ok || td.Err == sarama.ErrUnknownTopicOrPartition {
		return nil, fmt.Errorf("consume %s: %w on %s", o.Topic, errTopicNotFound, brokers)
	}
	if td.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("consume %s: %w", o.Topic, td.Err)
	}
	if o.Partition >= 0 && !slices.ContainsFunc(td.Partitions, func(p kafka.Partition) bool { return p.ID == int32(o.Partition) }) {
		return nil, fmt.Errorf("consume %s: no partition %d (the topic has %d)", o.Topic, o.Partition, len(td.Partitions))
	}
	var out []partRange
	for _, p := range td.Partitions {
		if o.Partition >= 0 && p.ID != int32(o.Partition) {
			continue
		}
		if p.Leader < 0 {
			return nil, fmt.Errorf("consume %s: partition %d has no leader", o.Topic, p.ID)
		}
		s, err := cl.ListOffset(mctx, o.Topic, p.ID, p.Leader, kafka.Earliest, sarama.ReadUncommitted)
		if err != nil {
			return nil, fmt.Errorf("consume %s: start offset of partition %d: %w", o.Topic, p.ID, err)
		}
		e, err := cl.ListOffset(mctx, o.Topic, p.ID, p.Leader, kafka.Latest, sarama.ReadCommitted)
		if err != nil {
			return nil, fmt.Errorf("consume %s: end offset of partition %d: %w", o.Topic, p.ID, err)
		}
		out = append(out, partRange{id: p.ID, leader: p.Leader, start: s, end: e})
	}
	slices.SortFunc(out, func(a, b partRange) int { return int(a.id) - int(b.id) })
	return out, nil
}

// consumer is one consumeTopic call's progress.
type consumer struct {
	o     consumeOptions
	cl    *kafka.Client
	w     *bufio.Writer
	n     int64
	parts []*consumed
	left  map[int32]int64 // UntilEnd: per partition still to read, the end to reach
}

// consumed is how far a partition has been read.
type consumed struct {
	id, leader int32
	at         int64 // the next offset to fetch
}

// retryWait is the pause before fetching again after a retriable error.
const retryWait = 200 * time.Millisecond

func (c *consumer) run(ctx context.Context) (int64, error) {
	for !c.o.UntilEnd || len(c.left) > 0 {
		for _, p := range c.parts {
			if c.o.UntilEnd && c.left[p.id] == 0 {
				continue
			}
			err := c.fetch(ctx, p)
			if ctx.Err() != nil {
				return c.n, c.w.Flush()
			}
			if err != nil {
				return c.n, err
			}
			if c.full() {
				return c.n, nil
			}
		}
	}
	return c.n, nil
}

// fetch reads the next records of p and writes them; a retriable error
// waits, finds p's leader again and returns nil.
func (c *consumer) fetch(ctx context.Context, p *consumed) error {
	f, err := c.cl.Fetch(ctx, c.o.Topic, p.id, p.leader, p.at, sarama.ReadCommitted)
	if err != nil {
		if ctx.Err() != nil || !retriable(err) {
			return fmt.Errorf("consume %s: %w", c.o.Topic, err)
		}
		if err := clock.Sleep(ctx, retryWait); err != nil {
			return nil
		}
		if md, err := c.cl.Metadata(ctx, []string{c.o.Topic}, false); err == nil {
			for _, mp := range md[c.o.Topic].Partitions {
				if mp.ID == p.id && mp.Leader >= 0 {
					p.leader = mp.Leader
				}
			}
		}
		return nil
	}
	var werr error
	for _, r := range f.Records {
		if werr == nil && !c.full() {
			werr = c.record(recordOf(c.o.Topic, p.id, r))
		}
	}
	p.at = max(p.at, f.Next)
	if end, open := c.left[p.id]; open && p.at >= end {
		delete(c.left, p.id) // read to the end, markers included
	}
	if werr == nil {
		werr = c.w.Flush()
	}
	if werr != nil {
		return fmt.Errorf("consume %s: write: %w", c.o.Topic, werr)
	}
	return nil
}

func recordOf(topic string, part int32, r kafka.Record) *record {
	out := &record{Topic: topic, Partition: part, Offset: r.Offset, Timestamp: r.Timestamp, Key: r.Key, Value: r.Value,
		control: r.Control}
	for _, h := range r.Headers {
		out.Headers = append(out.Headers, header{Key: string(h.Key), Value: h.Value})
	}
	return out
}

// retriable reports an error a fetch may succeed after: a leader moving,
// a broker away for a moment (kafka.IsRetriable), but not a topic or
// partition unknown, which ends the consume, nor CORRUPT_MESSAGE, which
// the same fetch answers again.
func retriable(err error) bool {
	var ke sarama.KError
	if errors.As(err, &ke) {
		return ke != sarama.ErrUnknownTopicOrPartition && ke != sarama.ErrInvalidMessage && kafka.IsRetriable(ke)
	}
	return true // no answer: the connection failed
}

// full says the count of records asked for is written.
func (c *consumer) full() bool { return c.o.Count > 0 && c.n >= c.o.Count }

// record writes r unless it is a transaction marker (or, with UntilEnd,
// past its partition's end), and notes how far its partition has been read.
func (c *consumer) record(r *record) error {
	end, open := c.left[r.Partition]
	if open && r.Offset+1 >= end {
		delete(c.left, r.Partition)
	}
	if r.control || (c.o.UntilEnd && (!open || r.Offset >= end)) {
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

// timestamp is a record's time as the output shows it.
func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

func consumedOf(r *record) consumedRecord {
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
func textLine(r *record) string {
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
func headerText(hs []header) string {
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
func formatRecord(f string, r *record) string {
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
