package tests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/internal/devkafka"
	"github.com/outboxd/outboxd/outbox"
)

// startBroker hosts a Kafka broker (kfake: the real protocol, transactions
// included) in the test process, outliving every server the test kills.
func startBroker(t *testing.T) string {
	t.Helper()
	b, err := devkafka.Start("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b.Addr()
}

// endMarker begins the value of the sentinel records a test appends to
// every partition once the relay is idle: reading up to them reads
// everything. Each read appends markers of its own (endMarker and a
// number), so that a topic read twice closes a partition at this read's
// marker, not at an earlier read's: those are skipped like the first.
const endMarker = "__end__"

// markerSeq numbers the reads' end markers.
var markerSeq atomic.Int64

// consumed is what a read_committed consumer found on a topic.
type consumed struct {
	Partition int32
	Offset    int64
	Key       string
	Value     string
	Headers   map[string]string
	Twice     []string // header keys the record carries more than once
}

// readAll appends a sentinel to every partition of each topic, then reads
// the topics with read_committed from the start up to the sentinels.
func readAll(t *testing.T, broker string, topics ...string) map[string][]consumed {
	t.Helper()
	return readAllWith(t, broker, nil, topics...)
}

// readAllWith is readAll with the clients' options (TLS, SASL).
func readAllWith(t *testing.T, broker string, opts []kgo.Opt, topics ...string) map[string][]consumed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	marker := fmt.Sprintf("%s%d-%d", endMarker, time.Now().UnixNano(), markerSeq.Add(1))
	parts := markEnds(ctx, t, broker, opts, topics, marker)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(broker), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	out := map[string][]consumed{}
	open := 0
	for _, n := range parts {
		open += n
	}
	closed := map[string]map[int32]bool{}
	for open > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %v: %d partitions not read to their end marker: %v", topics, open, ctx.Err())
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s[%d]: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if strings.HasPrefix(string(r.Value), endMarker) {
				if string(r.Value) == marker && !closed[r.Topic][r.Partition] {
					if closed[r.Topic] == nil {
						closed[r.Topic] = map[int32]bool{}
					}
					closed[r.Topic][r.Partition] = true
					open--
				}
				return
			}
			c := consumed{Partition: r.Partition, Offset: r.Offset, Key: string(r.Key), Value: string(r.Value), Headers: map[string]string{}}
			for _, h := range r.Headers {
				if _, ok := c.Headers[h.Key]; ok {
					c.Twice = append(c.Twice, h.Key)
				}
				c.Headers[h.Key] = string(h.Value)
			}
			out[r.Topic] = append(out[r.Topic], c)
		})
	}
	return out
}

// markEnds appends the end marker to every partition of each topic and
// returns the partition counts.
func markEnds(ctx context.Context, t *testing.T, broker string, opts []kgo.Opt, topics []string, marker string) map[string]int {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(broker), kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string]int{}
	for _, topic := range topics {
		d, ok := details[topic]
		if !ok || d.Err != nil {
			t.Fatalf("topic %s: not found (%v)", topic, d.Err)
		}
		parts[topic] = len(d.Partitions)
		for p := range d.Partitions {
			r := &kgo.Record{Topic: topic, Partition: p, Value: []byte(marker)}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("mark end of %s[%d]: %v", topic, p, err)
			}
		}
	}
	return parts
}

// proxy is a TCP proxy between the server and the broker that a test can
// cut. The broker advertises the proxy's address, so every connection of
// the server goes through it.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]bool
	down  bool
	delay time.Duration
}

// startProxiedBroker hosts a broker reachable only through a proxy and
// returns the proxy (whose Addr is the broker address to give the server).
func startProxiedBroker(t *testing.T) *proxy {
	t.Helper()
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	back, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: front, target: back.Addr().String(), conns: map[net.Conn]bool{}}
	// The broker listens on back but advertises front.
	b, err := devkafka.StartOn(advertised{back, front.Addr()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	go p.serve()
	t.Cleanup(func() { front.Close(); p.cut(); b.Close() })
	return p
}

// advertised is a listener that reports another address as its own.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		if !down {
			p.conns[c] = true
		}
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		go p.pipe(c)
	}
}

func (p *proxy) pipe(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[s] = true
	p.mu.Unlock()
	go p.copy(s, c)
	p.copy(c, s)
}

func (p *proxy) copy(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			d := p.delay
			p.mu.Unlock()
			if d > 0 {
				time.Sleep(d) // the injected latency itself
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cut closes every open connection.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// setDown refuses new connections (and cuts the open ones) while down.
func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
	if down {
		p.cut()
	}
}

// setDelay delays every chunk of bytes by d in both directions.
func (p *proxy) setDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

func atoi64(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// relayDone says whether the relay has published every outbox row.
func relayDone(ctx context.Context, s *outbox.Store) error {
	id, err := s.MetaID(ctx, "relay_id")
	if err != nil {
		return err
	}
	last, err := s.LastOutboxID(ctx)
	if err != nil {
		return err
	}
	done, err := s.RelayProgress(ctx, id)
	if err != nil {
		return err
	}
	if done != last {
		return fmt.Errorf("relay progress %d, want %d", done, last)
	}
	return nil
}
