package devkafka

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestKfakeLogger_Levels: kfake's notes on a client's timing are logged
// below WARN, its real problems at WARN and ERROR (formats as kfake writes
// them).
func TestKfakeLogger_Levels(t *testing.T) {
	for _, c := range []struct {
		level  kfake.LogLevel
		format string
		args   []any
		want   string
	}{
		{kfake.LogLevelWarn, "txn: EndTxn slow pid=%d epoch=%d elapsed=%dms batches=%d groups=%d", []any{1, 0, 6, 2, 0}, "DEBUG"},
		{kfake.LogLevelWarn, "consumerHeartbeatLate: group=%s member=%s gap=%dms interval=%dms", []any{"g", "m", 9, 3}, "DEBUG"},
		{kfake.LogLevelWarn, "txn timeout abort: txn_id=%s producer_id=%d epoch=%d timeout=%dms elapsed=%v", []any{"t", 1, 0, 10, "11ms"}, "INFO"},
		{kfake.LogLevelWarn, "consumerSessionTimeout: group=%s member=%s epoch=%d remaining=%d", []any{"g", "m", 1, 0}, "INFO"},
		{kfake.LogLevelWarn, "persist batch %s-%d: %v", []any{"t", 0, "no space left on device"}, "WARN"},
		{kfake.LogLevelWarn, "partition %s-%d segment %d: truncating %d corrupt bytes", []any{"t", 0, 0, 12}, "WARN"},
		{kfake.LogLevelError, "endTx: failed to persist control batch for %s p%d pid %d", []any{"t", 0, 1}, "ERROR"},
		{kfake.LogLevelInfo, "request %s", []any{"Produce"}, "DEBUG"},
	} {
		var buf bytes.Buffer
		l := kfakeLogger{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
		l.Logf(c.level, c.format, c.args...)
		if !strings.Contains(buf.String(), "level="+c.want+" ") {
			t.Errorf("%q logged %q, want level %s", c.format, buf.String(), c.want)
		}
	}
}
