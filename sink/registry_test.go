package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/sink"
)

func init() {
	sink.Register("testmem", sink.Kind{
		Check: func(s sink.Spec) error {
			if s.Options["bad"] != "" {
				return errors.New("option bad is set")
			}
			return nil
		},
		Open: func(ctx context.Context, s sink.Spec) (sink.Target, error) { return newMemTarget(9, 0, 0, true), nil },
	})
}

func TestRegistry(t *testing.T) {
	u, err := sink.ParseURL("TestMem://host:1/x")
	testutil.Must(t, err)
	tg, err := sink.Open(context.Background(), sink.Spec{Name: "m", URL: u})
	testutil.Must(t, err)
	if _, ok := tg.(*memTarget); !ok {
		t.Fatalf("Open made %T", tg)
	}
	if !strings.Contains(strings.Join(sink.Schemes(), ","), "testmem") {
		t.Fatalf("schemes %v", sink.Schemes())
	}
	cases := []struct {
		spec sink.Spec
		want string
	}{
		{sink.Spec{Name: "a b", URL: u}, `sink "a b": a name is letters`},
		{sink.Spec{Name: "m", URL: u, Options: map[string]string{"bad": "1"}}, "sink m: option bad is set"},
		{sink.Spec{Name: "m"}, "sink m: no URL"},
	}
	for _, c := range cases {
		if err := sink.Check(c.spec); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("Check(%+v) = %v, want %q", c.spec, err, c.want)
		}
	}
	nu, _ := sink.ParseURL("nosuch://h")
	if err := sink.Check(sink.Spec{Name: "m", URL: nu}); !errors.Is(err, sink.ErrUnknownScheme) ||
		!strings.Contains(err.Error(), `sink m: "nosuch://"`) {
		t.Errorf("unknown scheme: %v", err)
	}
	for _, bad := range []string{"127.0.0.1:4222", "nats://", "://x", "%zz"} {
		if _, err := sink.ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) accepted", bad)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("a scheme registered twice did not panic")
		}
	}()
	sink.Register("testmem", sink.Kind{Open: func(context.Context, sink.Spec) (sink.Target, error) { return nil, nil }})
}
