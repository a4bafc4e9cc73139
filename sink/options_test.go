package sink_test

import (
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink"
)

func TestSetOptions(t *testing.T) {
	var (
		name string
		on   bool
		n    int32
		d    time.Duration
	)
	known := []sink.Option{
		{Name: "name", Set: sink.Text(&name)},
		{Name: "on", Set: sink.Bool(&on)},
		{Name: "n", Set: sink.Count(&n, 1, 9)},
		{Name: "d", Set: sink.Duration(&d)},
	}
	if err := sink.SetOptions("a test sink", map[string]string{"name": "x", "on": "true", "n": "9", "d": "2s"}, known); err != nil {
		t.Fatal(err)
	}
	if name != "x" || !on || n != 9 || d != 2*time.Second {
		t.Fatalf("set %q %v %d %v", name, on, n, d)
	}
	for opt, want := range map[string]string{
		"colour=red": `option "colour": a test sink reads name, on, n, d`,
		"on=maybe":   `option on: "maybe": want true or false`,
		"n=10":       `option n: "10": want a number from 1 to 9`,
		"d=-1s":      `option d: "-1s": want a positive duration such as 500ms or 30s`,
	} {
		var k, v string
		for i := range opt {
			if opt[i] == '=' {
				k, v = opt[:i], opt[i+1:]
				break
			}
		}
		err := sink.SetOptions("a test sink", map[string]string{k: v}, known)
		if err == nil || err.Error() != want {
			t.Errorf("SetOptions(%s) = %v, want %q", opt, err, want)
		}
	}
}

func TestSpec_TopicsOf(t *testing.T) {
	s := sink.Spec{Topics: map[string]sink.TopicMap{"a": {Table: "ta"}, "b": {}}}
	got, err := s.TopicsOf("a test sink", "table")
	if err != nil || len(got) != 2 || got["a"] != "ta" || got["b"] != "" {
		t.Fatalf("TopicsOf = %v, %v", got, err)
	}
	s.Topics["c"] = sink.TopicMap{Path: "/c"}
	_, err = s.TopicsOf("a test sink", "table")
	if want := "topic c: a test sink reads table only (not stream, subject or path)"; err == nil || err.Error() != want {
		t.Fatalf("TopicsOf = %v, want %q", err, want)
	}
}

func TestNamed(t *testing.T) {
	if got := sink.Named(map[string]string{"a": "", "b": ""}); got != nil {
		t.Fatalf("Named of no values = %v, want nil", got)
	}
	if got := sink.Named(map[string]string{"a": "ta", "b": ""}); len(got) != 1 || got["a"] != "ta" {
		t.Fatalf("Named = %v, want map[a:ta]", got)
	}
}
