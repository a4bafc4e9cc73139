package webhook_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/sink"
)

func TestRegistered(t *testing.T) {
	for _, tc := range []struct {
		spec sink.Spec
		err  string
	}{
		{sink.Spec{}, "no secret"},
		{sink.Spec{Secret: "s", Options: map[string]string{"colour": "red"}}, `option "colour"`},
		{sink.Spec{Secret: "s", Topics: map[string]sink.TopicMap{"t": {Table: "x"}}}, "topic t: a webhook sink reads path only"},
	} {
		for _, scheme := range []string{"http", "https"} {
			u, err := sink.ParseURL(scheme + "://127.0.0.1:1/in")
			testutil.Must(t, err)
			tc.spec.Name, tc.spec.URL = "hook", u
			if err := sink.Check(tc.spec); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Check(%s, %+v) = %v, want %q", scheme, tc.spec, err, tc.err)
			}
		}
	}
	u, err := sink.ParseURL("https://127.0.0.1:1/in")
	testutil.Must(t, err)
	tg, err := sink.Open(context.Background(), sink.Spec{Name: "hook", URL: u, Secret: "s", Topics: map[string]sink.TopicMap{"t": {Path: "/t"}}})
	testutil.Must(t, err)
	defer tg.Close()
}
