package sqlproc

import (
	"reflect"
	"testing"
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
