package relay

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// proxy is a TCP proxy between clients and a broker that can cut every
// connection at once and refuse new ones until restored: a broker going
// down and coming back, as the client sees it.
type proxy struct {
	ln     net.Listener
	target string

	swallow atomic.Bool

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(tb testing.TB) *proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &proxy{ln: ln, conns: map[net.Conn]struct{}{}}
	tb.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// start forwards to target from now on.
func (p *proxy) start(target string) {
	p.target = target
	p.wg.Go(p.accept)
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			c.Close() // the client sees its connection die at once
			continue
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

func (p *proxy) forward(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(server, client)
		server.Close()
		client.Close()
	})
	wg.Go(func() {
		p.answer(client, server)
		server.Close()
		client.Close()
	})
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

// answer copies the broker's answers to the client, unless a swallow is
// armed: then the next answer is dropped and the proxy goes down.
func (p *proxy) answer(client, server net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 && p.swallow.CompareAndSwap(true, false) {
			p.cut()
			return
		}
		if n > 0 {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// swallowNextAnswer drops the broker's next answer on any connection and
// goes down: the request was handled, the client never learns how.
func (p *proxy) swallowNextAnswer() { p.swallow.Store(true) }

// track registers a connection pair, or closes it if the proxy went down
// meanwhile.
func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// cut closes every connection and refuses new ones until restore.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// isDown reports whether the proxy is cut.
func (p *proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

func (p *proxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *proxy) close() {
	p.cut()
	p.ln.Close()
	p.wg.Wait()
}

// proxiedCluster starts a one-broker kfake cluster that advertises the
// proxy's address, so every client connection goes through the proxy.
func proxiedCluster(tb testing.TB) (*kfake.Cluster, *proxy) {
	tb.Helper()
	p := newProxy(tb)
	c := newCluster(tb, kfake.ListenFn(func(network, addr string) (net.Listener, error) {
		ln, err := net.Listen(network, addr)
		if err != nil {
			return nil, err
		}
		p.start(ln.Addr().String())
		return advertised{ln, p.ln.Addr()}, nil
	}))
	if got := c.ListenAddrs(); len(got) != 1 || got[0] != p.addr() {
		tb.Fatalf("cluster advertises %v, want the proxy %s", got, p.addr())
	}
	return c, p
}

// advertised is a listener that reports another address: kfake advertises
// its listener's address to clients.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }
