// Package handle carries an outbox.Store's writer connection to
// outbox/outboxtest, so that tests can reach it while the outbox package
// exports no raw database handle. Being internal to outbox/, nothing else
// can import it.
package handle

import "github.com/jmoiron/sqlx"

// Writer returns the writer connection of store, an *outbox.Store. The
// outbox package sets it when it is initialised.
var Writer func(store any) *sqlx.DB
