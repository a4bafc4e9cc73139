package outbox

import (
	"context"
	"errors"
	"reflect"
	"sync"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// interruptOnEnd interrupts the SQLite connection dc (the driver side of
// a query connection) once ctx ends, while the returned stop has not been
// called; stop waits for an interrupt under way, so none reaches the
// connection's next statement.
//
// The driver interrupts a statement only while it computes its first
// row: it watches the context in the call that starts the statement, not
// in the steps that read the later rows. A query whose later row takes
// for ever (a recursion that never ends past its first row) would run on
// past its time limit and its client's disconnect, holding its
// connection. sqlite3_interrupt on the connection ends any step under
// way with SQLITE_INTERRUPT, and one that starts while the statement is
// still active. The driver does not export its connection's handle, so it
// is read from the driver's connection by its field's name; a driver
// without it is an error here, before the statement runs.
func interruptOnEnd(ctx context.Context, dc any) (stop func(), err error) {
	db, err := connHandle(dc)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	ended := false
	stopWatch := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			return
		}
		// A TLS of its own: the connection's may be in use by the step
		// this interrupts.
		tls := libc.NewTLS()
		sqlite3.Xsqlite3_interrupt(tls, db)
		tls.Close()
	})
	return func() {
		stopWatch()
		mu.Lock()
		ended = true
		mu.Unlock()
	}, nil
}

// connHandle is the sqlite3* handle of the driver's connection dc.
func connHandle(dc any) (uintptr, error) {
	v := reflect.ValueOf(dc)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		if f := v.FieldByName("db"); f.IsValid() && f.Kind() == reflect.Uintptr && f.Uint() != 0 {
			return uintptr(f.Uint()), nil
		}
	}
	return 0, errors.New("the SQLite driver's connection has no handle to interrupt a query with")
}
