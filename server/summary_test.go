package server

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		devBroker bool
		want      string
	}{
		{"Production", []string{"--feed", "ledger=file:/var/log/ledger.csv", "--processor", "ledger=ledger",
			"--feed", "orders=kafka:orders.events", "--processor", "orders=orders", "--brokers", "k1:9092,k2:9092"}, false,
			`level=INFO msg="outboxd running" feeds="ledger: file:/var/log/ledger.csv -> ledger -> ledger.out; ` +
				`orders: kafka:orders.events -> orders -> orders.status" db=./data/outboxd.db synchronous=full relay=exactly-once ` +
				`brokers=k1:9092,k2:9092 http=http://127.0.0.1:8080` + "\n"},
		{"DevBrokerAndNormal", []string{"--feed", "l=file:/a", "--synchronous", "normal"}, true,
			`level=INFO msg="outboxd running" feeds="l: file:/a -> forward -> l.out" db=./data/outboxd.db synchronous=normal ` +
				`relay=exactly-once brokers="dev broker 127.0.0.1:9092" http=http://127.0.0.1:8080` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig(tc.args, env(nil))
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
				ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
					if a.Key == slog.TimeKey {
						return slog.Attr{}
					}
					return a
				}}))
			attrs := summary(cfg, tc.devBroker, "http://127.0.0.1:8080")
			logger.LogAttrs(context.Background(), slog.LevelInfo, "outboxd running", attrs...)
			if buf.String() != tc.want {
				t.Fatalf("logged\n%s\nwant\n%s", buf.String(), tc.want)
			}
			if strings.Count(buf.String(), "\n") != 1 {
				t.Fatal("not one line")
			}
		})
	}
}
