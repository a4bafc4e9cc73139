package sqlproc

import (
	"reflect"
	"testing"
	"time"
)

func TestDefinition_RoundTrip(t *testing.T) {
	c := Config{Name: "led", Kind: Kind, Input: InputCSV, Columns: []string{"account", "amount"}, Text: []string{"account"},
		Trim: true, Setup: "CREATE TABLE IF NOT EXISTS b (a TEXT PRIMARY KEY, n INTEGER) STRICT;",
		Apply: "INSERT INTO b VALUES (:account, :amount)", Emit: "SELECT :account AS key, :amount AS value"}
	def, err := c.Definition()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"apply":"INSERT INTO b VALUES (:account, :amount)","columns":["account","amount"],` +
		`"emit":"SELECT :account AS key, :amount AS value","input":"csv","kind":"sql",` +
		`"setup":"CREATE TABLE IF NOT EXISTS b (a TEXT PRIMARY KEY, n INTEGER) STRICT;","text":["account"],"trim":true}`
	if string(def) != want {
		t.Fatalf("definition\n got %s\nwant %s", def, want)
	}
	back, err := ParseDefinition("led", def)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("read back %+v, want %+v", back, c)
	}
	c.Emit = "SELECT :account AS key, :amount + 0 AS value"
	other, _ := c.Definition()
	if string(other) == string(def) {
		t.Fatal("two emit statements give the same definition")
	}
}

func TestDefinitionVersion(t *testing.T) {
	for def, want := range map[string]int{
		`{"input":"raw"}`: 1,
		`{"version":3}`:   3,
		`{"migrations":[{"version":2,"sql":"x"},{"version":5}]}`: 5,
		`not json`: 1,
	} {
		if got := DefinitionVersion([]byte(def)); got != want {
			t.Errorf("DefinitionVersion(%s) = %d, want %d", def, got, want)
		}
	}
}

// TestDefinition_Features: migrations, a window and what the processor
// reads (each source's own definition) are in the definition and read
// back.
func TestDefinition_Features(t *testing.T) {
	src := Config{Name: "prices", Kind: Kind, Input: InputCSV, Columns: []string{"product", "price"},
		Setup: "CREATE TABLE IF NOT EXISTS prices (product TEXT PRIMARY KEY, price INTEGER) STRICT;",
		Apply: "INSERT INTO prices VALUES (:product, :price)"}
	c := Config{Name: "clicks", Kind: Kind, Input: InputJSON, Fields: map[string]string{"page": "$.page", "at": "$.at"},
		Setup:      "CREATE TABLE IF NOT EXISTS w (window_start INTEGER, page TEXT, n INTEGER);",
		Migrations: []Migration{{Version: 2, SQL: "CREATE INDEX w_page ON w (page)"}},
		Window:     Window{Time: "unixepoch(:at)", Size: time.Minute, Hop: 30 * time.Second, Lateness: 10 * time.Second, Late: LateCount, Table: "w"},
		Reads:      []string{"prices.prices"},
		ReadFrom:   []ReadSource{{Feed: "prices", Config: src, Tables: []string{"prices"}}},
		Apply:      "INSERT INTO w VALUES (:window_start, :page, 1)",
		Emit:       "SELECT page AS key, n AS value FROM w WHERE window_start = :window_start"}
	def, err := c.Definition()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseDefinition("clicks", def)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("read back\n%+v\nwant\n%+v\nfrom %s", back, c, def)
	}
	if DefinitionVersion(def) != 2 {
		t.Fatalf("version %d, want 2", DefinitionVersion(def))
	}
	for _, change := range []func(c *Config){
		func(c *Config) { c.Window.Lateness = 0 },
		func(c *Config) { c.Migrations[0].SQL = "CREATE INDEX w_n ON w (n)" },
		func(c *Config) { c.ReadFrom[0].Config.Apply += " -- changed" },
	} {
		d := c
		d.Migrations = append([]Migration{}, c.Migrations...)
		d.ReadFrom = append([]ReadSource{}, c.ReadFrom...)
		change(&d)
		if other, _ := d.Definition(); string(other) == string(def) {
			t.Fatalf("a change gives the same definition %s", def)
		}
	}
}
