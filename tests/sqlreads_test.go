package tests

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestSQLReads_Join: a feed of orders priced from the table the feed
// prices maintains (reads: [prices]), the built binary running both: the
// reader's feed starts whichever comes first, and each order sees the
// prices committed before it: exact outputs, across a restart.
func TestSQLReads_Join(t *testing.T) {
	dir := t.TempDir()
	prices, orders, db := filepath.Join(dir, "prices.csv"), filepath.Join(dir, "orders.csv"), filepath.Join(dir, "outboxd.db")
	config := filepath.Join(dir, "outboxd.yaml")
	writeFile(t, config, `processors:
  prices:
    kind: sql
    input: csv
    columns: [product, price]
    setup: |
      CREATE TABLE IF NOT EXISTS prices (product TEXT PRIMARY KEY, price INTEGER NOT NULL) STRICT;
    apply: |
      INSERT INTO prices VALUES (:product, :price) ON CONFLICT (product) DO UPDATE SET price = excluded.price;
  priced-orders:
    kind: sql
    input: csv
    columns: [order_id, product, qty]
    topic: orders.priced
    reads: [prices.prices]
    emit: |
      SELECT :order_id AS key, json_object('product', :product, 'total', :qty * p.price) AS value
      FROM (SELECT 1) LEFT JOIN prices AS p ON p.product = :product;
feeds:
  prices: {source: "file:`+prices+`", processor: prices}
  orders: {source: "file:`+orders+`", processor: priced-orders}
`)
	var want []string
	var pricesData, ordersData strings.Builder
	price := map[string]int{}
	for i := range 200 {
		product := fmt.Sprintf("p%d", i%13)
		price[product] = 1 + i%7
		fmt.Fprintf(&pricesData, "%s,%d\n", product, price[product])
	}
	writeFile(t, prices, pricesData.String())
	writeFile(t, orders, "")
	args := []string{"--config", config, "--db", db, "--relay", "none", "--http", "127.0.0.1:0"}
	p := start(t, nil, args...)
	waitRunning(t, p)
	waitPosition(t, db, "prices", int64(pricesData.Len()))
	for i := range 300 {
		product := fmt.Sprintf("p%d", i%17) // p13..p16 have no price
		total := "null"
		if pr, ok := price[product]; ok {
			total = fmt.Sprint(pr * (i%5 + 1))
		}
		fmt.Fprintf(&ordersData, "o%d,%s,%d\n", i, product, i%5+1)
		want = append(want, fmt.Sprintf(`o%d {"product":%q,"total":%s}`, i, product, total))
	}
	half := strings.Index(ordersData.String()[ordersData.Len()/2:], "\n") + ordersData.Len()/2 + 1
	appendFile(t, orders, ordersData.String()[:half])
	waitPosition(t, db, "orders", int64(half))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	p = start(t, nil, args...) // a restart: both set up again, nothing changes
	waitRunning(t, p)
	appendFile(t, orders, ordersData.String()[half:])
	waitPosition(t, db, "orders", int64(ordersData.Len()))
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if got := keyValues(allRows(t, readStore(t, db)), "orders.priced"); !reflect.DeepEqual(got, want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("output %d of %d/%d: %s, want %s", i, len(got), len(want), got[i], want[i])
			}
		}
		t.Fatalf("%d outputs, want %d", len(got), len(want))
	}
}
