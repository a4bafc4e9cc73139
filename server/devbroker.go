package server

import (
	"flag"
	"path/filepath"

	"github.com/outboxd/outboxd/outbox"
)

// DevBrokerConfig is the in-process dev broker's part of the
// configuration, used when no brokers are given.
type DevBrokerConfig struct {
	// Addr is where the dev broker listens.
	Addr string `yaml:"addr"`
	// Data is the dev broker's data directory: DevBrokerDataAuto for
	// "devbroker" beside the database, "" for memory only.
	Data string `yaml:"data"`
}

// DevBrokerDataAuto, as --dev-broker-data, keeps the dev broker's log in
// the directory "devbroker" beside the database.
const DevBrokerDataAuto = "auto"

// DefaultDevBrokerConfig returns the dev broker defaults.
func DefaultDevBrokerConfig() DevBrokerConfig {
	return DevBrokerConfig{Addr: "127.0.0.1:9092", Data: DevBrokerDataAuto}
}

// dir is the dev broker's data directory for a database at db, "" for
// memory only.
func (d DevBrokerConfig) dir(db string) string {
	if d.Data == DevBrokerDataAuto {
		if outbox.IsPostgres(db) {
			return "devbroker" // in the working directory: a URL has none
		}
		return filepath.Join(filepath.Dir(db), "devbroker")
	}
	return d.Data
}

func (d *DevBrokerConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&d.Addr, "dev-broker-addr", d.Addr, "`ADDR` the in-process dev broker listens on, when --brokers is empty")
	fs.StringVar(&d.Data, "dev-broker-data", d.Data, "`DIR` of the dev broker's log: auto for devbroker/ beside --db, '' for memory only")
}

// deprecatedKeys maps YAML keys that moved to where they are now; the old
// key still works, with a warning.
var deprecatedKeys = map[string]string{
	"relay.devBrokerAddr": "devBroker.addr",
	"relay.devBrokerData": "devBroker.data",
}
