// Package kafka is the product's one way to Kafka for everything but the
// relay's producing: topic metadata, creation, deletion and settings, ACL
// probes (the operations a principal has on a topic), offsets, one-off
// fetches and a consumer loop (Consume) at either isolation level, all as
// raw sarama requests to the broker that must answer them, and records
// produced outside any transaction (Produce, on sarama's producer),
// connected with the TLS and SASL of a kafkasec.Settings. The relay's
// producers (relay/txnproducer.go and sarama's AsyncProducer) and the
// Kafka feed's consumer are sarama too; Config is the configuration they
// start from. IsRetriable and IsNetworkError are the product's one list of
// the Kafka failures a retry mends, which relay.Classify, Consume and the
// consume command share.
//
// A Client connects lazily, so one made while Kafka is away works once it
// is back. Every call takes a context: when it is done, the connection the
// call waits on is closed, the call returns ctx's error, and the
// connection is opened again by the next call. No goroutine outlives its
// call.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/kafkasec"
)

// Version is the protocol version the product's sarama clients assume.
var Version = sarama.V3_6_0_0

// Config is the sarama configuration every product client starts from:
// its client id, Version, the dial timeout, sec's TLS and SASL, no topic
// created by a metadata request.
func Config(clientID string, sec kafkasec.Settings) *sarama.Config {
	sc := sarama.NewConfig()
	sc.ClientID = clientID
	sc.Version = Version
	sc.Net.DialTimeout = 5 * time.Second
	sc.Net.WriteTimeout = 5 * time.Second
	sc.Metadata.AllowAutoTopicCreation = false
	sec.Sarama(sc)
	return sc
}

// Request versions of the requests a Client sends: Kafka 2.4's, the oldest
// broker the relay's transactional producer speaks to.
const (
	metadataVersion        = 8  // topic authorized operations
	listOffsetsVersion     = 2  // isolation level
	fetchVersion           = 11 // isolation level, aborted transactions, log start offset
	createTopicsVersion    = 3  // per-topic error messages
	describeConfigsVersion = 1
)

// requestTimeout bounds one request when ctx has no earlier deadline.
const requestTimeout = 10 * time.Second

// Client sends requests to a cluster. It is safe for concurrent use.
type Client struct {
	conf  *sarama.Config
	seeds []*sarama.Broker

	// Principal is who the brokers' ACLs see this client as (see
	// kafkasec.Settings.Principal).
	Principal string

	conns *Dialer // every connection, to cut those a done context waits on

	mu      sync.Mutex
	brokers map[int32]*sarama.Broker // from the last metadata
	next    int                      // the seed to try first
	closed  bool
}

// New returns a client of brokers (host:port) that connects with sec's
// TLS and SASL under clientID. It connects on its first request.
func New(brokers []string, clientID string, sec kafkasec.Settings) (*Client, error) {
	if len(brokers) == 0 {
		return nil, errors.New("kafka client: no broker address")
	}
	c := &Client{conf: Config(clientID, sec), Principal: sec.Principal(), brokers: map[int32]*sarama.Broker{}}
	c.conf.Net.ReadTimeout = requestTimeout
	c.conns = NewDialer(c.conf.Net.DialTimeout)
	c.conns.Use(c.conf)
	if err := c.conf.Validate(); err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	for _, b := range brokers {
		c.seeds = append(c.seeds, sarama.NewBroker(b))
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.conns.cancel()
	for _, b := range c.seeds {
		_ = b.Close()
	}
	for _, b := range c.brokers {
		_ = b.Close()
	}
}

// ErrClosed is returned by the calls of a closed Client.
var ErrClosed = errors.New("kafka client: closed")

// open connects b unless it is connected.
func (c *Client) open(b *sarama.Broker) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if ok, _ := b.Connected(); ok {
		return nil
	}
	if err := b.Open(c.conf); err != nil && !errors.Is(err, sarama.ErrAlreadyConnected) {
		return err
	}
	return nil
}

// do runs req on b. When ctx is done first, it closes b's connection,
// which ends req, and returns ctx's error.
func (c *Client) do(ctx context.Context, b *sarama.Broker, req func(*sarama.Broker) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.open(b); err != nil {
		return fmt.Errorf("broker %s: %w", b.Addr(), err)
	}
	done := make(chan error, 1)
	go func() { done <- req(b) }()
	select {
	case err := <-done:
		if err != nil && isConnectionError(err) {
			// A connection that failed once is dialled afresh next time.
			_ = b.Close()
		}
		if err != nil && !c.conf.Net.TLS.Enable && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
			return fmt.Errorf("broker %s: %w: %s", b.Addr(), err, kafkasec.TLSMissingHint)
		}
		if err != nil {
			return fmt.Errorf("broker %s: %w", b.Addr(), err)
		}
		return nil
	case <-ctx.Done():
		// Cutting the connection ends whatever holds it (the request, or
		// the handshake of its opening); closing the broker then resets
		// it for the next call.
		c.conns.cut(b.Addr())
		<-done
		_ = b.Close()
		return ctx.Err()
	}
}

// any runs req on the first broker that answers: the brokers of the last
// metadata, then the seeds.
func (c *Client) any(ctx context.Context, req func(*sarama.Broker) error) error {
	var errs []error
	for _, b := range c.candidates() {
		err := c.do(ctx, b, req)
		if err == nil || !isConnectionError(err) || ctx.Err() != nil {
			return err
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("%w: %w", sarama.ErrOutOfBrokers, errors.Join(errs...))
}

func (c *Client) candidates() []*sarama.Broker {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*sarama.Broker, 0, len(c.brokers)+len(c.seeds))
	for _, b := range c.brokers {
		out = append(out, b)
	}
	for i := range c.seeds {
		out = append(out, c.seeds[(c.next+i)%len(c.seeds)])
	}
	c.next++
	return out
}

// broker returns the broker of id as the last metadata named it, asking
// for topic's metadata when none did.
func (c *Client) broker(ctx context.Context, id int32, topic string) (*sarama.Broker, error) {
	c.mu.Lock()
	b, ok := c.brokers[id]
	c.mu.Unlock()
	if ok {
		return b, nil
	}
	if err := c.any(ctx, func(b *sarama.Broker) error {
		_, err := c.metadata(b, []string{topic}, false)
		return err
	}); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.brokers[id]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("broker %d: %w", id, sarama.ErrBrokerNotFound)
}

// learn keeps the brokers a metadata response names, closing those it no
// longer names or names at another address.
func (c *Client) learn(resp *sarama.MetadataResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[int32]bool{}
	for _, nb := range resp.Brokers {
		seen[nb.ID()] = true
		if old, ok := c.brokers[nb.ID()]; ok && old.Addr() == nb.Addr() {
			continue
		} else if ok {
			_ = old.Close()
		}
		c.brokers[nb.ID()] = nb
	}
	for id, b := range c.brokers {
		if !seen[id] {
			_ = b.Close()
			delete(c.brokers, id)
		}
	}
}

// Dialer dials a sarama client's connections (set it with Use) and keeps
// them by address, so that they can be cut: those to one broker, whose
// call's context is done, or all of them at once, when the client's work
// must end now and nothing of it may reach the brokers later.
type Dialer struct {
	d      net.Dialer
	ctx    context.Context // ends dials in progress at CutAll
	cancel context.CancelFunc
	mu     sync.Mutex
	by     map[string]map[*conn]bool
	closed bool
}

// NewDialer returns a Dialer whose dials time out after timeout.
func NewDialer(timeout time.Duration) *Dialer {
	ctx, cancel := context.WithCancel(context.Background())
	return &Dialer{d: net.Dialer{Timeout: timeout}, ctx: ctx, cancel: cancel, by: map[string]map[*conn]bool{}}
}

// Use makes sc's connections d's.
func (d *Dialer) Use(sc *sarama.Config) {
	sc.Net.Proxy.Enable, sc.Net.Proxy.Dialer = true, d
}

// ErrCut is the error of a dial after CutAll.
var ErrCut = errors.New("kafka: the client's connections were cut")

// Dial connects to addr (sarama's dialer).
func (d *Dialer) Dial(network, addr string) (net.Conn, error) {
	nc, err := d.d.DialContext(d.ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: nc, d: d, addr: addr}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		_ = nc.Close()
		return nil, ErrCut
	}
	if d.by[addr] == nil {
		d.by[addr] = map[*conn]bool{}
	}
	d.by[addr][c] = true
	return c, nil
}

// cut closes every connection to addr.
func (d *Dialer) cut(addr string) {
	d.mu.Lock()
	list := make([]*conn, 0, len(d.by[addr]))
	for c := range d.by[addr] {
		list = append(list, c)
	}
	d.mu.Unlock()
	for _, c := range list {
		_ = c.Close()
	}
}

// CutAll closes every connection, ends dials in progress and refuses new
// ones: every request of the client in flight fails at once.
func (d *Dialer) CutAll() {
	d.mu.Lock()
	d.closed = true
	addrs := make([]string, 0, len(d.by))
	for a := range d.by {
		addrs = append(addrs, a)
	}
	d.mu.Unlock()
	d.cancel()
	for _, a := range addrs {
		d.cut(a)
	}
}

// conn is a connection that leaves its Dialer when closed.
type conn struct {
	net.Conn
	d    *Dialer
	addr string
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.d.mu.Lock()
		delete(c.d.by[c.addr], c)
		c.d.mu.Unlock()
	})
	return c.Conn.Close()
}
