// Package nats is the NATS JetStream sink target (nats:// URLs): each
// output is one message in a stream, exactly once for a single relay.
//
// Every message a sink publishes to a stream carries, besides the output's
// own headers, Nats-Msg-Id (SINK-ID, ID the outbox id), Outboxd-Id (the
// outbox id) and Outboxd-Sink (the sink's name), and two expectations the
// server checks before it stores the message: Nats-Expected-Last-Sequence
// (the stream's last sequence, as the sink knows it) and, but for the
// first message of a delivery, Nats-Expected-Last-Msg-Id (the sink's
// previous message). A message is stored only if the one before it in the
// delivery is the stream's last, so what a failed delivery stored is a
// prefix of it, in outbox id order, with nothing of anyone else between:
// the deliveries can be pipelined (Options inflight) and stay exactly
// once. Resume reads the stream's messages back from its end to find the
// sink's last one, and the next delivery skips what the stream holds.
//
// Another writer on the same stream: its messages land between the sink's
// deliveries, never inside one (a delivery whose expectation another
// message broke fails, and is resumed after the sink's last message);
// exactly-once and the id order of the sink's messages still hold.
// Resume finds the sink's last message by scanning back from the stream's
// end, up to Options resumeScan messages: past that it refuses to guess
// (the sink backs off with the error). Another writer that publishes with
// the sink's own Nats-Msg-Id values or Outboxd-Sink header is not told
// apart from the sink.
package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/sink"
)

// The headers every message of a sink carries.
const (
	HeaderID       = "Outboxd-Id"       // the outbox id
	HeaderSink     = "Outboxd-Sink"     // the sink's name
	HeaderTopic    = "Outboxd-Topic"    // the output's topic
	HeaderKey      = "Outboxd-Key"      // the output's key, when it is text a header can hold
	HeaderKeyBytes = "Outboxd-Key-Hex"  // ... else its bytes in hex
	HeaderFeed     = "Outboxd-Feed"     // the feed, partition and position of the item
	HeaderPosition = "Outboxd-Position" // PARTITION:EPOCH:POSITION
)

// ReasonTooLarge is the dead letter reason of an output larger than the
// server or the stream takes.
const ReasonTooLarge = "output-too-large"

// Options are a NATS sink's own settings (the sink's options map).
type Options struct {
	// Stream is the stream of the topics that name none (default OUTBOXD).
	Stream string
	// CreateStream creates a missing stream, taking the subjects mapped to
	// it (default true); false: a missing stream is an error.
	CreateStream bool
	// Inflight is the most messages published before their acks are in
	// (default 512).
	Inflight int
	// Timeout bounds a request and the wait for an ack (default 10s).
	Timeout time.Duration
	// ResumeScan is the most messages Resume reads back from a stream's
	// end to find the sink's last one (default 10000).
	ResumeScan int
}

func parseOptions(m map[string]string) (Options, error) {
	o := Options{Stream: "OUTBOXD", CreateStream: true, Inflight: 512, Timeout: 10 * time.Second, ResumeScan: 10000}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := m[k]
		var err error
		switch k {
		case "stream":
			o.Stream = v
			err = checkStreamName(v)
		case "createStream":
			o.CreateStream, err = strconv.ParseBool(v)
		case "inflight":
			o.Inflight, err = strconv.Atoi(v)
			if err == nil && (o.Inflight < 1 || o.Inflight > 65536) {
				err = errors.New("want 1 to 65536")
			}
		case "timeout":
			o.Timeout, err = time.ParseDuration(v)
			if err == nil && o.Timeout <= 0 {
				err = errors.New("want a positive duration")
			}
		case "resumeScan":
			o.ResumeScan, err = strconv.Atoi(v)
			if err == nil && o.ResumeScan < 1 {
				err = errors.New("want at least 1")
			}
		default:
			return o, fmt.Errorf("unknown option %q (NATS takes stream, createStream, inflight, timeout, resumeScan)", k)
		}
		if err != nil {
			return o, fmt.Errorf("option %s=%q: %w", k, v, err)
		}
	}
	return o, nil
}

// checkStreamName refuses a name JetStream does not take.
func checkStreamName(s string) error {
	if s == "" || strings.ContainsAny(s, " \t\r\n.*>/\\") {
		return fmt.Errorf("stream name %q: no spaces, '.', '*', '>', '/' or '\\'", s)
	}
	return nil
}

// checkSubject refuses a subject a message cannot be published to.
func checkSubject(s string) error {
	if s == "" {
		return errors.New("an empty subject")
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("subject %q: want tokens separated by '.', without spaces or wildcards", s)
		}
	}
	return nil
}

// route is where one topic goes.
type route struct{ stream, subject string }

// routes are the spec's topics' streams and subjects; a topic not mapped
// (a sink taking every topic) goes to the default stream, subject the
// topic's name.
func routes(spec sink.Spec, o Options) (map[string]route, error) {
	out := map[string]route{}
	for t, m := range spec.Topics {
		r := route{stream: m.Stream, subject: m.Subject}
		if r.stream == "" {
			r.stream = o.Stream
		}
		if r.subject == "" {
			r.subject = t
		}
		if err := checkStreamName(r.stream); err != nil {
			return nil, fmt.Errorf("topic %s: %w", t, err)
		}
		if err := checkSubject(r.subject); err != nil {
			return nil, fmt.Errorf("topic %s: %w", t, err)
		}
		if m.Table != "" || m.Path != "" {
			return nil, fmt.Errorf("topic %s: a NATS sink maps a topic to a stream and a subject, not a table or a path", t)
		}
		out[t] = r
	}
	return out, nil
}

func init() {
	sink.Register("nats", sink.Kind{Check: Check, Open: func(_ context.Context, spec sink.Spec) (sink.Target, error) {
		return New(spec)
	}})
}

// Check reports a mistake in a NATS sink's settings.
func Check(spec sink.Spec) error {
	o, err := parseOptions(spec.Options)
	if err != nil {
		return err
	}
	if _, err := routes(spec, o); err != nil {
		return err
	}
	if spec.Secret != "" {
		return errors.New("a NATS sink takes no secret (credentials go in the URL: nats://USER:PASSWORD@HOST:PORT)")
	}
	return nil
}

// Target publishes a sink's rows to JetStream. It connects in Resume.
type Target struct {
	spec   sink.Spec
	opts   Options
	routes map[string]route
	log    *slog.Logger

	mu sync.Mutex // guards nc for Close
	nc *nats.Conn
	js jetstream.JetStream

	// streams is what the target knows of each stream it publishes to,
	// set by Resume and kept by Deliver; only the runner's goroutine
	// touches it.
	streams map[string]*streamState
	// maxPayload bounds a message (the server's max_payload and the
	// stream's max_msg_size, the smaller); 0 while unknown.
	maxPayload map[string]int64
}

// streamState is a stream as the sink knows it.
type streamState struct {
	name     string
	subjects []string // the sink's subjects in it
	lastSeq  uint64   // the stream's last sequence
	lastID   int64    // the sink's last outbox id the stream holds
	// lastMsgID is the sink's last Nats-Msg-Id when its message is the
	// stream's last, "" otherwise.
	lastMsgID string
}

// New makes the target of spec; it connects in Resume.
func New(spec sink.Spec) (*Target, error) {
	if err := Check(spec); err != nil {
		return nil, err
	}
	o, _ := parseOptions(spec.Options)
	rs, _ := routes(spec, o)
	log := spec.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Target{spec: spec, opts: o, routes: rs, log: log, maxPayload: map[string]int64{}}, nil
}

// routeOf is where a row of topic goes.
func (t *Target) routeOf(topic string) route {
	if r, ok := t.routes[topic]; ok {
		return r
	}
	return route{stream: t.opts.Stream, subject: topic}
}

// connect makes the connection when there is none (or it closed).
func (t *Target) connect() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nc != nil && !t.nc.IsClosed() {
		return nil
	}
	nc, err := nats.Connect(t.spec.URL.String(),
		nats.Name("outboxd sink "+t.spec.Name),
		nats.Timeout(t.opts.Timeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.NoCallbacksAfterClientClose())
	if err != nil {
		return fmt.Errorf("connect to %s: %w", t.spec.URL.Redacted(), err)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(t.opts.Inflight),
		jetstream.WithPublishAsyncTimeout(t.opts.Timeout))
	if err != nil {
		nc.Close()
		return fmt.Errorf("jetstream: %w", err)
	}
	t.nc, t.js = nc, js
	return nil
}

// Resume connects, checks (or creates) each stream, and returns the
// largest outbox id up to which every stream holds all of its rows: the
// smallest of the streams' last ids of the sink. Deliver skips the rows a
// stream holds past it.
func (t *Target) Resume(ctx context.Context) (int64, error) {
	if err := t.connect(); err != nil {
		return 0, err
	}
	byStream := map[string][]string{}
	for _, r := range t.routes {
		if !slices.Contains(byStream[r.stream], r.subject) {
			byStream[r.stream] = append(byStream[r.stream], r.subject)
		}
	}
	if len(t.routes) == 0 { // every topic: the default stream, whatever subjects it has
		byStream[t.opts.Stream] = nil
	}
	prev := t.streams
	t.streams = nil
	streams := map[string]*streamState{}
	resume := int64(-1)
	for name, subjects := range byStream {
		sort.Strings(subjects)
		st, err := t.resumeStream(ctx, name, subjects, prev[name])
		if err != nil {
			t.streams = prev // what it knew still holds
			return 0, err
		}
		streams[name] = st
		if resume < 0 || st.lastID < resume {
			resume = st.lastID
		}
	}
	t.streams = streams
	return max(resume, 0), nil
}

// resumeStream reads what stream name holds of the sink.
func (t *Target) resumeStream(ctx context.Context, name string, subjects []string, prev *streamState) (*streamState, error) {
	ctx, cancel := context.WithTimeout(ctx, t.opts.Timeout)
	defer cancel()
	s, err := t.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = t.createStream(ctx, name, subjects)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("stream %s: info: %w", name, err)
	}
	for _, subj := range subjects {
		if !covers(info.Config.Subjects, subj) {
			return nil, fmt.Errorf("stream %s takes subjects %v, not %s: add it to the stream, or map the topic to another one",
				name, info.Config.Subjects, subj)
		}
	}
	if len(subjects) == 0 {
		subjects = info.Config.Subjects
	}
	limit := int64(t.nc.MaxPayload())
	if info.Config.MaxMsgSize > 0 {
		limit = min(limit, int64(info.Config.MaxMsgSize))
	}
	t.maxPayload[name] = limit
	st := &streamState{name: name, subjects: subjects, lastSeq: info.State.LastSeq}
	if err := t.findLast(ctx, s, st, prev); err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	t.log.Debug("nats sink resumed", "sink", t.spec.Name, "stream", name, "last_seq", st.lastSeq, "last_id", st.lastID)
	return st, nil
}

// createStream creates a missing stream, when allowed, with the sink's
// subjects for it.
func (t *Target) createStream(ctx context.Context, name string, subjects []string) (jetstream.Stream, error) {
	if !t.opts.CreateStream {
		return nil, fmt.Errorf("%w (createStream is false: create it, with the subjects %v)", jetstream.ErrStreamNotFound, subjects)
	}
	if len(subjects) == 0 {
		return nil, fmt.Errorf("%w: a sink taking every topic needs its stream made beforehand, with the topics' subjects", jetstream.ErrStreamNotFound)
	}
	s, err := t.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return t.js.Stream(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	t.log.Info("created the JetStream stream", "sink", t.spec.Name, "stream", name, "subjects", subjects)
	return s, nil
}

// findLast finds the sink's last message in the stream. After a
// delivery of this process (prev), the sink's messages that landed
// unacknowledged follow its last acknowledged one, one after the other
// (each expected the one before it as the stream's last): a read forward
// from there finds them. Otherwise the last message of each of its
// subjects tells, unless another writer's is last on one: then a scan
// back from the stream's end, up to ResumeScan messages; past that, the
// sink's last id is taken as unknown (0): the runner resumes after the
// progress the store keeps, and a message published again within the
// stream's duplicate window is dropped by JetStream as a duplicate.
func (t *Target) findLast(ctx context.Context, s jetstream.Stream, st, prev *streamState) error {
	if st.lastSeq == 0 {
		return nil
	}
	if prev != nil && prev.lastSeq <= st.lastSeq {
		return t.readForward(ctx, s, st, prev)
	}
	ours := true
	var best *jetstream.RawStreamMsg
	for _, subj := range st.subjects {
		if strings.ContainsAny(subj, "*>") {
			ours = false // a wildcard of the stream's: scan
			break
		}
		m, err := s.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("last message of %s: %w", subj, err)
		}
		if !t.mine(m.Header) {
			ours = false
			break
		}
		if best == nil || m.Sequence > best.Sequence {
			best = m
		}
	}
	if !ours {
		var err error
		best, err = t.scanBack(ctx, s, st.lastSeq)
		if errors.Is(err, errScanTooLong) {
			t.log.Warn("the sink's last message in the stream is not among its last messages (another writer publishes to it): "+
				"resuming after the progress the store keeps; JetStream drops a message published again within the stream's duplicate window",
				"sink", t.spec.Name, "stream", st.name, "scanned", t.opts.ResumeScan)
			return nil
		}
		if err != nil {
			return err
		}
	}
	return t.take(st, best)
}

// take sets st from m, the sink's last message in the stream (nil: none).
func (t *Target) take(st *streamState, m *jetstream.RawStreamMsg) error {
	if m == nil {
		return nil
	}
	id, err := strconv.ParseInt(m.Header.Get(HeaderID), 10, 64)
	if err != nil {
		return fmt.Errorf("message %d: header %s %q: %w", m.Sequence, HeaderID, m.Header.Get(HeaderID), err)
	}
	st.lastID = id
	st.lastMsgID = ""
	if m.Sequence == st.lastSeq {
		st.lastMsgID = m.Header.Get(jetstream.MsgIDHeader)
	}
	return nil
}

// readForward reads the stream from after prev's last sequence while the
// messages are the sink's.
func (t *Target) readForward(ctx context.Context, s jetstream.Stream, st, prev *streamState) error {
	st.lastID = prev.lastID
	if prev.lastSeq == st.lastSeq {
		st.lastMsgID = prev.lastMsgID
		return nil
	}
	var last *jetstream.RawStreamMsg
	for seq := prev.lastSeq + 1; seq <= st.lastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("message %d: %w", seq, err)
		}
		if !t.mine(m.Header) {
			break
		}
		last = m
	}
	if last == nil {
		return nil // another writer's came next
	}
	return t.take(st, last)
}

// errScanTooLong says the scan back gave up.
var errScanTooLong = errors.New("the sink's last message is not among the stream's last ResumeScan messages")

// scanBack reads the stream back from seq to its first message, up to
// ResumeScan messages, for the sink's last one (nil for none).
func (t *Target) scanBack(ctx context.Context, s jetstream.Stream, seq uint64) (*jetstream.RawStreamMsg, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	for n := 0; seq >= info.State.FirstSeq && seq > 0; seq, n = seq-1, n+1 {
		if n >= t.opts.ResumeScan {
			return nil, errScanTooLong
		}
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted
		}
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", seq, err)
		}
		if t.mine(m.Header) {
			return m, nil
		}
	}
	return nil, nil
}

// mine says whether a message is one of the sink's.
func (t *Target) mine(h nats.Header) bool {
	return h.Get(HeaderSink) == t.spec.Name && h.Get(HeaderID) != ""
}

// covers says whether a stream's subject filters take subject.
func covers(filters []string, subject string) bool {
	for _, f := range filters {
		if subjectMatch(f, subject) {
			return true
		}
	}
	return false
}

func subjectMatch(filter, subject string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range ft {
		if f == ">" {
			return len(st) > i
		}
		if i >= len(st) || (f != "*" && f != st[i]) {
			return false
		}
	}
	return len(ft) == len(st)
}

// Screen refuses the rows larger than their stream takes.
func (t *Target) Screen(rows []outbox.Row) (keep []outbox.Row, refused []outbox.RowDeadLetter) {
	keep = rows[:0:0]
	for _, r := range rows {
		rt := t.routeOf(r.Topic)
		limit := t.maxPayload[rt.stream]
		if size := messageSize(r, t.spec.Name); limit > 0 && size > limit {
			refused = append(refused, outbox.RowDeadLetter{Row: r, Reason: ReasonTooLarge,
				Error: fmt.Sprintf("a message of %d bytes with its headers; stream %s takes at most %d", size, rt.stream, limit)})
			continue
		}
		keep = append(keep, r)
	}
	return keep, refused
}

// messageSize is about what a row's message takes: its value, headers
// and subject.
func messageSize(r outbox.Row, sinkName string) int64 {
	return int64(len(r.Value)+2*len(r.Key)+len(r.Headers)+len(r.Topic)+len(r.Feed)+len(r.Epoch)+len(sinkName)) + 256
}

// message is the row's message, with its headers.
func (t *Target) message(r outbox.Row, subject string) (*nats.Msg, error) {
	m := nats.NewMsg(subject)
	m.Data = r.Value
	hs, err := outbox.DecodeHeaders(r.Headers)
	if err != nil {
		return nil, fmt.Errorf("outbox row %d: headers: %w", r.ID, err)
	}
	for _, h := range hs {
		m.Header.Add(h.Key, string(h.Value))
	}
	id := strconv.FormatInt(r.ID, 10)
	m.Header.Set(HeaderID, id)
	m.Header.Set(HeaderSink, t.spec.Name)
	m.Header.Set(HeaderTopic, r.Topic)
	if len(r.Key) > 0 {
		if textHeader(r.Key) {
			m.Header.Set(HeaderKey, string(r.Key))
		} else {
			m.Header.Set(HeaderKeyBytes, fmt.Sprintf("%x", r.Key))
		}
	}
	m.Header.Set(HeaderFeed, r.Feed)
	m.Header.Set(HeaderPosition, fmt.Sprintf("%d:%s:%d", r.Partition, r.Epoch, r.Position))
	return m, nil
}

// textHeader says whether b can be a header's value as it is.
func textHeader(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c == 0x7f || c >= 0x80 {
			return false
		}
	}
	return len(b) > 0 && b[0] != ' ' && b[len(b)-1] != ' '
}

// msgID is the Nats-Msg-Id of the sink's message of outbox id id.
func (t *Target) msgID(id int64) string { return t.spec.Name + "-" + strconv.FormatInt(id, 10) }

// pending is a published message waiting for its ack.
type pending struct {
	id     int64
	stream *streamState
	msgID  string
	fut    jetstream.PubAckFuture
}

// Deliver publishes rows, pipelined: up to Inflight messages before their
// acks. Each message expects the stream's last sequence and, but for the
// first to a stream, the sink's previous message as the stream's last, so
// a failure leaves a prefix of each stream's rows stored (see the package
// doc); the rows a stream holds already (id at most its last one) are
// skipped.
func (t *Target) Deliver(ctx context.Context, rows []outbox.Row) ([]outbox.RowDeadLetter, error) {
	if t.js == nil || t.streams == nil {
		return nil, errors.New("not resumed")
	}
	var inflight []pending
	var firstErr error
	settle := func(upTo int) {
		for _, p := range inflight[:upTo] {
			if err := t.await(ctx, p); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		inflight = inflight[upTo:]
	}
	// The expectations of the next message to each stream: the sequence
	// and the message id it expects last.
	nextSeq := map[string]uint64{}
	lastMsg := map[string]string{}
	for name, st := range t.streams {
		nextSeq[name], lastMsg[name] = st.lastSeq, st.lastMsgID
	}
	for _, r := range rows {
		if firstErr != nil {
			break
		}
		rt := t.routeOf(r.Topic)
		st := t.streams[rt.stream]
		if st == nil {
			return nil, fmt.Errorf("outbox row %d: stream %s was not resumed", r.ID, rt.stream)
		}
		if r.ID <= st.lastID {
			continue // the stream holds it
		}
		m, err := t.message(r, rt.subject)
		if err != nil {
			return nil, err
		}
		opts := []jetstream.PublishOpt{jetstream.WithMsgID(t.msgID(r.ID)), jetstream.WithExpectLastSequence(nextSeq[rt.stream]),
			jetstream.WithRetryAttempts(0), jetstream.WithExpectStream(rt.stream)}
		if lm := lastMsg[rt.stream]; lm != "" {
			opts = append(opts, jetstream.WithExpectLastMsgID(lm))
		}
		if len(inflight) >= t.opts.Inflight {
			settle(len(inflight) / 2)
			if firstErr != nil {
				break
			}
		}
		fut, err := t.js.PublishMsgAsync(m, opts...)
		if err != nil {
			firstErr = fmt.Errorf("publish outbox row %d to %s: %w", r.ID, rt.subject, err)
			break
		}
		inflight = append(inflight, pending{id: r.ID, stream: st, msgID: t.msgID(r.ID), fut: fut})
		nextSeq[rt.stream]++
		lastMsg[rt.stream] = t.msgID(r.ID)
	}
	settle(len(inflight))
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, nil
}

// await waits for p's ack and moves its stream's state on.
func (t *Target) await(ctx context.Context, p pending) error {
	select {
	case ack := <-p.fut.Ok():
		if ack.Duplicate {
			// Stored before (an ack lost): the stream holds it, but the
			// sequence is the first copy's, not necessarily the last.
			p.stream.lastID = max(p.stream.lastID, p.id)
			p.stream.lastMsgID = ""
			return nil
		}
		p.stream.lastSeq, p.stream.lastID, p.stream.lastMsgID = ack.Sequence, p.id, p.msgID
		return nil
	case err := <-p.fut.Err():
		return fmt.Errorf("publish outbox row %d to %s: %w", p.id, p.fut.Msg().Subject, err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the connection.
func (t *Target) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nc != nil {
		t.nc.Close()
		t.nc = nil
	}
	return nil
}
