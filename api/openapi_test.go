package api_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
	"github.com/outboxd/outboxd/sink"
)

func init() {
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
}

// specChecker sends requests and validates each answer against
// openapi.yaml, counting the operations it has seen.
type specChecker struct {
	t      *testing.T
	router routers.Router
	seen   map[string]bool // "METHOD /path"
}

// specServer is the server URL the router matches; requests go to several
// test servers, and are matched as if sent to this one.
const specServer = "http://outboxd.test"

func newSpecChecker(t *testing.T) *specChecker {
	t.Helper()
	ctx := context.Background()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(ctx); err != nil {
		t.Fatalf("openapi.yaml is not valid OpenAPI 3: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: specServer}}
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &specChecker{t: t, router: r, seen: map[string]bool{}}
}

// check sends the request and validates the answer, which must have status
// want; it returns the body.
func (c *specChecker) check(base, method, path, token string, want int) []byte {
	c.t.Helper()
	return c.checkBody(base, method, path, token, "", want)
}

// checkBody is check with a JSON request body ("" for none).
func (c *specChecker) checkBody(base, method, path, token, reqBody string, want int) []byte {
	c.t.Helper()
	var rd io.Reader
	if reqBody != "" {
		rd = strings.NewReader(reqBody)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	match, err := http.NewRequest(method, specServer+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	route, params, err := c.router.FindRoute(match)
	if err != nil {
		c.t.Fatalf("%s %s: not in openapi.yaml: %v", method, path, err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		c.t.Fatal(err)
	}
	if res.StatusCode != want {
		c.t.Fatalf("%s %s: status %d, want %d: %s", method, path, res.StatusCode, want, body)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status: res.StatusCode, Header: res.Header, Body: io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		c.t.Fatalf("%s %s (%d) does not match openapi.yaml: %v\nbody: %s", method, path, res.StatusCode, err, body)
	}
	c.seen[route.Method+" "+route.Path] = true
	return body
}

// The states the spec lists are the states there are.
func TestOpenAPI_States(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	var spec []string
	for _, v := range doc.Components.Schemas["State"].Value.Enum {
		spec = append(spec, v.(string))
	}
	var states []string
	for _, st := range outbox.FeedStates {
		states = append(states, string(st))
	}
	if !slices.Equal(spec, states) {
		t.Fatalf("openapi.yaml's states %v, outbox's %v", spec, states)
	}
}

func TestOpenAPI_ResponsesMatch(t *testing.T) {
	outboxtest.SQLiteOnly(t, "the refusals, types and encodings checked are SQLite's; PostgreSQL's state queries: outbox TestPostgres_Query")
	cfg := api.DefaultConfig()
	cfg.AdminToken = testToken
	h := newHarness(t, cfg)
	h.script()
	base := h.ts.URL
	c := newSpecChecker(t)

	c.check(base, "GET", "/", "", 200)
	c.check(base, "GET", "/openapi.yaml", "", 200)
	c.check(base, "GET", "/healthz", "", 200)
	c.check(base, "GET", "/readyz", "", 200)
	c.check(base, "GET", "/metrics", "", 200)
	c.check(base, "GET", "/feeds", "", 200)
	c.check(base, "GET", "/outbox/status", "", 200)
	c.check(base, "GET", "/sinks", "", 200) // none
	c.check(base, "GET", "/feeds/ledger/status", "", 200)
	c.check(base, "GET", "/feeds/nope/status", "", 404)
	c.check(base, "GET", "/feeds/ledger/dead-letters", "", 401)
	c.check(base, "GET", "/feeds/ledger/dead-letters", readerToken, 200)
	c.check(base, "GET", "/feeds/ledger/dead-letters?limit=1", readerToken, 200)
	c.check(base, "GET", "/feeds/ledger/dead-letters?limit=1&reason=malformed&open=true", readerToken, 200)
	c.check(base, "GET", "/feeds/ledger/dead-letters?limit=0", readerToken, 400)
	c.check(base, "GET", "/feeds/ledger/dead-letters?open=maybe", readerToken, 400)
	c.check(base, "GET", "/feeds/nope/dead-letters", readerToken, 404)

	var page api.DeadLetterPage
	h.getJSON("/feeds/ledger/dead-letters", &page)
	junk, x := page.DeadLetters[0].ID, page.DeadLetters[1].ID
	rq := func(id int64) string { return "/feeds/ledger/dead-letters/" + itoa(id) + "/requeue" }
	c.check(base, "GET", "/feeds/ledger/dead-letters/"+itoa(x), readerToken, 200)
	c.check(base, "GET", "/feeds/ledger/dead-letters/999", readerToken, 404)
	c.check(base, "POST", rq(x), "", 401)
	c.check(base, "POST", rq(x), "wrong-token-0123456789", 401)
	c.check(base, "POST", rq(x), readerToken, 403)
	c.check(base, "POST", rq(x), testToken, 200)
	c.check(base, "POST", rq(x), testToken, 200)
	c.check(base, "POST", rq(junk), testToken, 422)
	c.checkBody(base, "POST", rq(junk), testToken, `{"payload": "junk", "payloadEncoding": "utf-16"}`, 400)
	c.checkBody(base, "POST", rq(junk), testToken, `{"payload": "junk", "unknown": 1}`, 400)
	c.check(base, "POST", rq(999), testToken, 404)
	c.check(base, "GET", "/feeds/ledger/dead-letters", readerToken, 200) // with a requeuedAt
	part := func(id int64, p string) string { return "/feeds/ledger/dead-letters/" + itoa(id) + "/" + p }
	c.check(base, "GET", part(junk, "payload"), "", 401)
	if b := c.check(base, "GET", part(junk, "payload"), readerToken, 200); string(b) != "junk" {
		t.Fatalf("payload %q, want junk", b)
	}
	c.check(base, "GET", part(junk, "key"), readerToken, 200)
	c.check(base, "GET", part(999, "payload"), readerToken, 404)
	c.check(base, "GET", "/feeds/ledger/dead-letters/zero/key", readerToken, 400)
	// The junk line, edited into a ledger line: applied.
	c.checkBody(base, "POST", rq(junk), testToken, `{"payload": "YWNjdC05LDM=", "payloadEncoding": "base64", "note": "fixed"}`, 200)
	c.check(base, "GET", "/feeds/ledger/dead-letters", readerToken, 200) // with an edited requeue
	discard := "/feeds/ledger/dead-letters/" + itoa(junk) + "/discard"
	c.check(base, "POST", discard, testToken, 400) // no note
	c.checkBody(base, "POST", discard, testToken, `{"note": "test data"}`, 200)
	c.checkBody(base, "POST", "/feeds/ledger/dead-letters/999/discard", testToken, `{"note": "x"}`, 404)
	c.checkBody(base, "POST", "/feeds/ledger/dead-letters/discard?reason=malformed", testToken, `{"note": "x"}`, 200)
	c.checkBody(base, "POST", "/feeds/ledger/dead-letters/discard", testToken, `{"note": "x"}`, 400)
	c.checkBody(base, "POST", "/feeds/nope/dead-letters/discard?reason=malformed", testToken, `{"note": "x"}`, 404)
	c.check(base, "POST", "/feeds/ledger/dead-letters/requeue?reason=rejected", testToken, 200)
	c.check(base, "POST", "/feeds/ledger/dead-letters/requeue", testToken, 400)
	c.check(base, "POST", "/feeds/nope/dead-letters/requeue?reason=rejected", testToken, 404)
	c.check(base, "POST", "/feeds/ledger/losses/ack", "", 401)
	c.check(base, "POST", "/feeds/ledger/losses/ack", testToken, 400) // no reason
	c.checkBody(base, "POST", "/feeds/ledger/losses/ack", testToken, `{"reason": "reviewed"}`, 200)
	c.checkBody(base, "POST", "/feeds/nope/losses/ack", testToken, `{"reason": "reviewed"}`, 404)
	c.check(base, "GET", "/status", "", 200)
	c.check(base, "GET", "/history", "", 200) // empty
	for range 2 {
		if err := h.srv.RecordHistory(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	c.check(base, "GET", "/history", "", 200)
	c.check(base, "GET", "/history?since=1", "", 200)
	c.check(base, "GET", "/history?since=x", "", 400)
	c.check(base, "GET", "/topics", "", 404) // no Kafka
	c.check(base, "GET", "/topics/ledger.out", "", 404)
	c.check(base, "GET", "/feeds/ledger/status", "", 200) // with ackedAt
	tx, err := h.store.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.RecordLoss(context.Background(), outbox.Loss{Feed: feedName, Reason: "truncated, no copy", Epoch: h.epoch1,
		From: 40, To: ingest.UnknownPosition}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	c.check(base, "GET", "/feeds/ledger/status", "", 200) // with a loss of unknown extent

	// Without a token the admin endpoints answer 403; a disconnected relay
	// makes /readyz answer 503; a stored-only feed cannot be requeued (409).
	r := &fakeRelay{}
	r.set(api.RelayStatus{Mode: "exactly-once", State: "backing-off", LastError: "kafka: client has run out of available brokers"})
	srv, err := api.New(api.DefaultConfig(), h.store, nil, r, quiet())
	if err != nil {
		t.Fatal(err)
	}
	other := newTestServer(t, srv)
	c.check(other, "POST", rq(x), testToken, 403)
	c.check(other, "POST", "/feeds/ledger/losses/ack", "", 403)
	c.check(other, "GET", "/feeds/ledger/dead-letters", "", 403)
	c.check(other, "GET", "/status", "", 200) // the relay down, a feed not lossless, dead letters
	c.check(other, "GET", "/readyz", "", 503)
	c.check(other, "GET", "/outbox/status", "", 200)
	srv.SetSinks(func() []api.SinkStatus {
		return []api.SinkStatus{
			{Name: "js", Kind: "nats", URL: "nats://u:xxxxx@h:4222", State: sink.StateBackingOff, Topics: []string{"ledger.out"},
				Delivered: 7, Stored: 7, LagRows: 3, LagBytes: 300, DeliveredTotal: 7, Errors: 2, LastError: "connection refused",
				LastErrorAt: time.Unix(1, 0).UTC(), LastDeliveryAt: time.Unix(2, 0).UTC()},
			{Name: "all", Kind: "https", URL: "https://h/x", State: sink.StateIdle, Topics: []string{}},
		}
	})
	c.check(other, "GET", "/sinks", "", 200)
	c.check(other, "GET", "/outbox/status", "", 200)       // with sinks
	c.check(other, "GET", "/feeds/ledger/status", "", 200) // configured: false
	srv, err = api.New(api.Config{AdminToken: testToken}, h.store, nil, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	srv.SetKafka(&fakeKafka{})
	other = newTestServer(t, srv)
	c.check(other, "POST", rq(junk), testToken, 409)
	c.check(other, "POST", "/feeds/ledger/dead-letters/requeue?reason=malformed", testToken, 409)
	c.check(other, "GET", "/topics", "", 200)
	c.check(other, "GET", "/topics/ledger.out?group=g1&group=g2", "", 200)
	c.check(other, "GET", "/topics/nope", "", 404)
	c.check(other, "GET", "/topics/down", "", 502)

	// The state queries: an answer, a cut one, bad parameters, an unknown
	// query, one not ready and one past its time limit.
	qbase, _ := queryServer(t, outbox.QueryLimits{Timeout: 100 * time.Millisecond, MaxRows: 1}, testQueries...)
	c.check(qbase, "GET", "/queries", "", 200)
	c.check(qbase, "GET", "/queries/balance?feed=l&account=alice", "", 200)
	c.check(qbase, "GET", "/queries/all", "", 200)
	c.check(qbase, "GET", "/queries/balance?feed=l", "", 400)
	c.check(qbase, "GET", "/queries/nope", "", 404)
	c.check(qbase, "GET", "/queries/later?k=a", "", 503)
	c.check(qbase, "GET", "/queries/spin", "", 504)

	// A database shared by servers: its servers, partitions and leases.
	c.check(base, "GET", "/cluster", "", 200) // none
	ctx := context.Background()
	cs := openStore(t)
	if err := cs.Share(ctx, "s1", "http://s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ClaimPartition(ctx, "g", 0, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ClaimPartition(ctx, "g", 1, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cs.AcquireLease(ctx, "relay", "s1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := cs.RegisterFeed(ctx, outbox.FeedInfo{Name: "g", Kind: "kafka"}); err != nil {
		t.Fatal(err)
	}
	csrv, err := api.New(api.DefaultConfig(), cs, nil, nil, quiet())
	if err != nil {
		t.Fatal(err)
	}
	shared := newTestServer(t, csrv)
	c.check(shared, "GET", "/cluster", "", 200)
	c.check(shared, "GET", "/feeds/g/status", "", 200) // with owners

	// Every operation of openapi.yaml was exercised.
	doc, _ := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	var missing []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !c.seen[method+" "+path] {
				missing = append(missing, method+" "+path)
			}
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Fatalf("operations not exercised: %s", strings.Join(missing, ", "))
	}
}

// fakeKafka is a cluster of one topic, ledger.out, with one partition; the
// topic "down" fails as an unreachable Kafka does.
type fakeKafka struct{}

func (fakeKafka) Topics(context.Context) ([]api.KafkaTopic, error) {
	return []api.KafkaTopic{{Topic: "ledger.out", Partitions: 1}}, nil
}

func (fakeKafka) Topic(_ context.Context, name string, groups []string) (api.KafkaTopicDetail, error) {
	switch name {
	case "ledger.out":
	case "down":
		return api.KafkaTopicDetail{}, errors.New("dial tcp 127.0.0.1:9092: connection refused")
	default:
		return api.KafkaTopicDetail{}, fmt.Errorf("topic %s: %w", name, outbox.ErrNotFound)
	}
	committed := int64(3)
	p := api.KafkaPartition{Partition: 0, Leader: 1, Start: 0, End: 6, Positions: []api.FeedOffset{}}
	for i, g := range groups {
		gl := api.GroupLag{Group: g, Lag: 6}
		if i == 0 {
			gl.Committed, gl.Lag = &committed, 3
		}
		p.Groups = append(p.Groups, gl)
	}
	return api.KafkaTopicDetail{Topic: name, Partitions: []api.KafkaPartition{p}, Groups: groups}, nil
}
