package pgtable_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/sink"
)

func TestRegistered(t *testing.T) {
	for _, tc := range []struct {
		spec sink.Spec
		err  string
	}{
		{sink.Spec{Options: map[string]string{"colour": "red"}}, `option "colour"`},
		{sink.Spec{Secret: "s"}, "takes no secret"},
		{sink.Spec{Topics: map[string]sink.TopicMap{"t": {Path: "/x"}}}, "topic t: a PostgreSQL sink reads table only"},
		{sink.Spec{Topics: map[string]sink.TopicMap{"t": {Table: "bad name"}}}, `table "bad name"`},
	} {
		for _, scheme := range []string{"postgres", "postgresql"} {
			u, err := sink.ParseURL(scheme + "://u@127.0.0.1:1/db")
			testutil.Must(t, err)
			tc.spec.Name, tc.spec.URL = "pg", u
			if err := sink.Check(tc.spec); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Check(%s, %+v) = %v, want %q", scheme, tc.spec, err, tc.err)
			}
		}
	}
	db := pgtest.New(t)
	if !strings.HasPrefix(db.DSN, "postgres://") {
		t.Skipf("the server found is reached by %q, not a URL", db.DSN)
	}
	u, err := sink.ParseURL(db.DSN)
	testutil.Must(t, err)
	tg, err := sink.Open(context.Background(), sink.Spec{Name: "pg", URL: u, Topics: map[string]sink.TopicMap{"t": {Table: "tt"}, "u": {}}})
	testutil.Must(t, err)
	defer tg.Close()
	id, err := tg.Resume(context.Background())
	testutil.Must(t, err)
	testutil.Equal(t, "Resume", id, int64(0))
	c := db.Conn(t)
	for _, tb := range []string{"tt", "outboxd_outputs", "outboxd_sink_progress"} {
		var ok bool
		testutil.Must(t, c.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, tb).Scan(&ok))
		if !ok {
			t.Fatalf("table %s not created", tb)
		}
	}
}
