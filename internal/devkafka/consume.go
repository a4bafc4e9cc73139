package devkafka

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ConsumedRecord is one record as `consume --format json` writes it.
type ConsumedRecord struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Key and Value are the record's bytes as a string (invalid UTF-8
	// shows as U+FFFD); nil when the record has none.
	Key     *string          `json:"key"`
	Value   *string          `json:"value"`
	Headers []ConsumedHeader `json:"headers"`
}

// ConsumedHeader is one record header, in the record's order.
type ConsumedHeader struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Output formats of Consume.
const (
	FormatText = "text" // one line per record: partition, offset, key, value, headers
	FormatJSON = "json" // one ConsumedRecord object per line
)

// DefaultConnectTimeout bounds how long Consume waits for the brokers to
// answer its first metadata request.
const DefaultConnectTimeout = 5 * time.Second

// ConsumeOptions says what Consume reads and how it writes it.
type ConsumeOptions struct {
	Brokers []string
	Topic   string
	// FromBeginning reads each partition from its start; otherwise only
	// records produced after the call are read.
	FromBeginning bool
	// UntilEnd stops once every partition has been read up to its end as
	// it was when Consume started (its last stable offset: what a
	// read_committed consumer can see then).
	UntilEnd bool
	// Format is FormatText (default) or FormatJSON.
	Format string
	// ConnectTimeout bounds the wait for the first answer of the brokers
	// (DefaultConnectTimeout when zero).
	ConnectTimeout time.Duration
	// ClientOpts are added to the client's options (TLS, SASL).
	ClientOpts []kgo.Opt
}

// ErrTopicNotFound is returned by Consume for a topic the brokers do not have.
var ErrTopicNotFound = errors.New("topic not found")

// Consume reads a topic with read_committed isolation and writes each
// record to w as it arrives, in o.Format. It returns the number of records
// written. It runs until ctx is done (then it returns nil) or, with
// UntilEnd, until it has read every partition to the end it had when it
// started. It returns an error within ConnectTimeout when no broker answers
// or the topic does not exist (wrapping ErrTopicNotFound), and on a write
// error or a non-retriable Kafka error.
func Consume(ctx context.Context, o ConsumeOptions, w io.Writer) (int64, error) {
	if o.Format == "" {
		o.Format = FormatText
	}
	if o.Format != FormatText && o.Format != FormatJSON {
		return 0, fmt.Errorf("consume: format %q is not one of text, json", o.Format)
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	ends, err := topicEnds(ctx, o)
	if err != nil {
		return 0, err
	}
	if o.UntilEnd && !o.FromBeginning {
		return 0, nil // what is produced after the call lies past the ends
	}
	start := kgo.NewOffset().AtEnd()
	if o.FromBeginning {
		start = kgo.NewOffset().AtStart()
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumeTopics(o.Topic),
		kgo.ConsumeResetOffset(start),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers take offsets too: seeing them tells when a
		// partition has been read to its end.
		kgo.KeepControlRecords(),
	}, o.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("consume %s: %w", o.Topic, err)
	}
	defer cl.Close()
	c := &consumer{o: o, w: bufio.NewWriter(w), left: ends}
	return c.run(ctx, cl)
}

// consumer is one Consume call's progress.
type consumer struct {
	o    ConsumeOptions
	w    *bufio.Writer
	n    int64
	left map[int32]int64 // UntilEnd: per partition still to read, the end to reach
}

func (c *consumer) run(ctx context.Context, cl *kgo.Client) (int64, error) {
	for !c.o.UntilEnd || len(c.left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return c.n, nil
		}
		if err := fetchError(fs); err != nil {
			return c.n, fmt.Errorf("consume %s: %w", c.o.Topic, err)
		}
		var werr error
		fs.EachRecord(func(r *kgo.Record) {
			if werr == nil {
				werr = c.record(r)
			}
		})
		if werr == nil {
			werr = c.w.Flush()
		}
		if werr != nil {
			return c.n, fmt.Errorf("consume %s: write: %w", c.o.Topic, werr)
		}
	}
	return c.n, nil
}

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
	if c.o.Format == FormatJSON {
		b, err := json.Marshal(consumed(r))
		if err != nil {
			return err
		}
		c.w.Write(b)
		return c.w.WriteByte('\n')
	}
	_, err := c.w.WriteString(textLine(r))
	return err
}

// topicEnds checks that the brokers answer and the topic exists, and returns
// the last stable offset of every partition that holds records.
func topicEnds(ctx context.Context, o ConsumeOptions) (map[int32]int64, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(o.Brokers...)}, o.ClientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", o.Topic, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	mctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	md, err := adm.Metadata(mctx, o.Topic)
	if err != nil {
		if mctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("consume %s: no broker of %s answered within %v", o.Topic, strings.Join(o.Brokers, ","), o.ConnectTimeout)
		}
		return nil, fmt.Errorf("consume %s: no broker of %s answered: %w", o.Topic, strings.Join(o.Brokers, ","), err)
	}
	td, ok := md.Topics[o.Topic]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		return nil, fmt.Errorf("consume %s: %w on %s", o.Topic, ErrTopicNotFound, strings.Join(o.Brokers, ","))
	}
	if td.Err != nil {
		return nil, fmt.Errorf("consume %s: %w", o.Topic, td.Err)
	}
	offs, err := adm.ListCommittedOffsets(mctx, o.Topic)
	if err != nil {
		return nil, fmt.Errorf("consume %s: end offsets: %w", o.Topic, err)
	}
	starts, err := adm.ListStartOffsets(mctx, o.Topic)
	if err != nil {
		return nil, fmt.Errorf("consume %s: start offsets: %w", o.Topic, err)
	}
	ends := map[int32]int64{}
	var ferr error
	offs.Each(func(lo kadm.ListedOffset) {
		if lo.Err != nil {
			ferr = lo.Err
			return
		}
		if s, ok := starts.Lookup(lo.Topic, lo.Partition); ok && s.Offset < lo.Offset {
			ends[lo.Partition] = lo.Offset
		}
	})
	if ferr != nil {
		return nil, fmt.Errorf("consume %s: end offsets: %w", o.Topic, ferr)
	}
	return ends, nil
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

func consumed(r *kgo.Record) ConsumedRecord {
	c := ConsumedRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Key: bytesPtr(r.Key), Value: bytesPtr(r.Value), Headers: make([]ConsumedHeader, 0, len(r.Headers))}
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, ConsumedHeader{Key: h.Key, Value: string(h.Value)})
	}
	return c
}

// textLine is one record for people: "partition offset key value", then
// the headers as key=value; a missing key or value shows as "-", a string
// with spaces or unprintable bytes is quoted.
func textLine(r *kgo.Record) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(int64(r.Partition), 10))
	b.WriteByte('\t')
	b.WriteString(strconv.FormatInt(r.Offset, 10))
	b.WriteByte('\t')
	b.WriteString(textField(r.Key))
	b.WriteByte('\t')
	b.WriteString(textField(r.Value))
	for i, h := range r.Headers {
		if i == 0 {
			b.WriteByte('\t')
		} else {
			b.WriteByte(' ')
		}
		b.WriteString(h.Key)
		b.WriteByte('=')
		b.WriteString(textField(h.Value))
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

func bytesPtr(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}
