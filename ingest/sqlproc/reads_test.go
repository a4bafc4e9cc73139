package sqlproc_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/outboxd/outboxd/ingest"
	"github.com/outboxd/outboxd/ingest/sqlproc"
	"github.com/outboxd/outboxd/outbox"
)

// pricesConfig keeps a price per product, and their history.
func pricesConfig() sqlproc.Config {
	return sqlproc.Config{
		Name:    "prices",
		Input:   sqlproc.InputCSV,
		Columns: []string{"product", "price"},
		Topic:   "prices.out",
		Setup: `CREATE TABLE IF NOT EXISTS prices (product TEXT PRIMARY KEY, price INTEGER NOT NULL) STRICT;
CREATE TABLE IF NOT EXISTS price_history (product TEXT NOT NULL, price INTEGER NOT NULL) STRICT;`,
		Apply: `INSERT INTO prices (product, price) VALUES (:product, :price) ON CONFLICT (product) DO UPDATE SET price = excluded.price;
INSERT INTO price_history VALUES (:product, :price);`,
	}
}

// ordersConfig enriches each order with the product's price, which the
// feed "prices" maintains.
func ordersConfig(tables ...string) sqlproc.Config {
	return sqlproc.Config{
		Name:     "orders",
		Input:    sqlproc.InputCSV,
		Columns:  []string{"order_id", "product", "qty"},
		Topic:    "orders.priced",
		Reads:    []string{"prices"},
		ReadFrom: []sqlproc.ReadSource{{Feed: "prices", Config: pricesConfig(), Tables: tables}},
		Emit: `SELECT :order_id AS key,
       json_object('order', :order_id, 'product', :product, 'qty', :qty, 'total', :qty * p.price) AS value
FROM (SELECT 1) LEFT JOIN prices AS p ON p.product = :product`,
	}
}

func TestReads_Join(t *testing.T) {
	s := openStore(t, nil)
	orders, prices := newProc(t, ordersConfig()), newProc(t, pricesConfig())
	// The reader starts first: its setup makes the tables it reads.
	setup(t, s, orders)
	setup(t, s, prices)
	setup(t, s, orders)
	d := func(feed string, pos int64) ingest.Delivery {
		dl := at(pos)
		dl.Feed = feed
		return dl
	}
	for i, l := range []struct {
		p    ingest.Processor
		feed string
		line string
	}{
		{prices, "prices", "apple,3"},
		{orders, "orders", "o1,apple,2"},
		{orders, "orders", "o2,pear,1"}, // no price yet
		{prices, "prices", "pear,5"},
		{prices, "prices", "apple,4"},
		{orders, "orders", "o3,apple,10"},
		{orders, "orders", "o4,pear,2"},
	} {
		if err := applyItem(t, s, l.p, d(l.feed, int64(i+1)), line(l.line)); err != nil {
			t.Fatalf("%s %q: %v", l.feed, l.line, err)
		}
	}
	var got []string
	for _, r := range rows(t, s) {
		got = append(got, fmt.Sprintf("%s %s %s", r.Topic, r.Key, r.Value))
	}
	want := []string{
		`orders.priced o1 {"order":"o1","product":"apple","qty":2,"total":6}`,
		`orders.priced o2 {"order":"o2","product":"pear","qty":1,"total":null}`,
		`orders.priced o3 {"order":"o3","product":"apple","qty":10,"total":40}`,
		`orders.priced o4 {"order":"o4","product":"pear","qty":2,"total":10}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outputs:\n%q\nwant\n%q", got, want)
	}
}

func TestReads_Refused(t *testing.T) {
	withApply := func(apply string) sqlproc.Config {
		c := ordersConfig()
		c.Apply = apply
		return c
	}
	withSetup := func(setup string) sqlproc.Config {
		c := ordersConfig()
		c.Setup = setup
		return c
	}
	noReads := ordersConfig()
	noReads.Reads, noReads.ReadFrom = nil, nil
	for _, c := range []struct {
		name string
		cfg  sqlproc.Config
		want string
	}{
		{"Write", withApply("UPDATE prices SET price = price + 1 WHERE product = :product"),
			"sqlproc orders: apply (UPDATE prices SET price = price + 1 WHERE produc ...): writes table prices of feed prices (another feed's tables are read, never written)"},
		{"Delete", withApply("DELETE FROM price_history"),
			"sqlproc orders: apply (DELETE FROM price_history): writes table price_history of feed prices (another feed's tables are read, never written)"},
		{"Trigger", withSetup("CREATE TRIGGER IF NOT EXISTS tr AFTER INSERT ON prices BEGIN SELECT 1; END"),
			"sqlproc orders: setup (CREATE TRIGGER IF NOT EXISTS tr AFTER INSERT ON ...): creates trigger tr on table prices of feed prices, which only its own processor changes"},
		{"Alter", withSetup("ALTER TABLE prices ADD COLUMN x TEXT"),
			"sqlproc orders: setup (ALTER TABLE prices ADD COLUMN x TEXT): alters table prices of feed prices, which only its own processor changes"},
		{"Drop", withSetup("DROP TABLE IF EXISTS price_history"),
			"sqlproc orders: setup (DROP TABLE IF EXISTS price_history): drops table price_history of feed prices, which only its own processor changes"},
		{"NoSuchTable", ordersConfig("prices", "nope"),
			"sqlproc orders: reads: feed prices's processor prices makes no table nope (its tables: price_history, prices)"},
		{"NotListed", func() sqlproc.Config {
			c := ordersConfig("price_history")
			return c
		}(), "sqlproc orders: emit (SELECT :order_id AS key, json_object('order', :o ...): reads table prices of feed prices, which reads does not name"},
		{"NotRead", noReads, "sqlproc orders: emit (SELECT :order_id AS key, json_object('order', :o ...): no such table: prices"},
		{"Self", func() sqlproc.Config {
			c := ordersConfig()
			c.ReadFrom[0].Config.Name = "orders"
			return c
		}(), "sqlproc orders: reads: feed prices runs this processor itself"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := sqlproc.New(c.cfg)
			if err == nil || err.Error() != c.want {
				t.Fatalf("New = %v\nwant  %s", err, c.want)
			}
		})
	}
	// Reading only the table listed is allowed.
	if _, err := sqlproc.New(ordersConfig("prices")); err != nil {
		t.Fatal(err)
	}
}

// TestReads_Migrations: the reader's start runs the migrations of the
// processor it reads, once, under that processor's name.
func TestReads_Migrations(t *testing.T) {
	s := openStore(t, nil)
	pc := pricesConfig()
	pc.Migrations = []sqlproc.Migration{{Version: 2, SQL: "ALTER TABLE prices ADD COLUMN currency TEXT NOT NULL DEFAULT 'EUR'"}}
	oc := ordersConfig()
	oc.ReadFrom[0].Config = pc
	oc.Emit = "SELECT :order_id AS key, p.currency AS value FROM prices AS p WHERE p.product = :product"
	orders, prices := newProc(t, oc), newProc(t, pc)
	setup(t, s, orders)
	setup(t, s, prices)
	var vs []struct {
		P string `db:"processor"`
		V int64  `db:"version"`
	}
	if err := inTx(t, s, func(tx *outbox.Tx) error {
		return tx.Select(context.Background(), &vs, "SELECT processor, version FROM processor_migrations")
	}); err != nil {
		t.Fatal(err)
	}
	if len(vs) != 1 || vs[0].P != "prices" || vs[0].V != 2 {
		t.Fatalf("migrations = %+v, want prices 2 once", vs)
	}
	if err := applyItem(t, s, prices, at(1), line("apple,3")); err != nil {
		t.Fatal(err)
	}
	if err := applyItem(t, s, orders, at(2), line("o1,apple,1")); err != nil {
		t.Fatal(err)
	}
	if rs := rows(t, s); len(rs) != 1 || string(rs[0].Value) != "EUR" {
		t.Fatalf("outputs = %+v, want one EUR", rs)
	}
}
