package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/outboxd/outboxd/api"
	"github.com/outboxd/outboxd/internal/testutil"
	"github.com/outboxd/outboxd/internal/testutil/pgtest"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/outbox/outboxtest"
)

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	testutil.Must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	testutil.Must(t, json.NewDecoder(resp.Body).Decode(v))
}

// TestCluster: two servers sharing one PostgreSQL database; either one's
// API shows every server with its partitions and leases (/cluster), and
// every partition of the shared feed with its owner and lag
// (/feeds/{name}/status), from the store.
func TestCluster(t *testing.T) {
	db := pgtest.New(t)
	ctx := context.Background()
	a := outboxtest.OpenStore(t, outbox.DefaultConfig(db.DSN))
	b := outboxtest.OpenStore(t, outbox.DefaultConfig(db.DSN))
	testutil.Must(t, a.Share(ctx, "a", "http://a:8080"))
	testutil.Must(t, b.Share(ctx, "b", "http://b:8080"))
	testutil.Must(t, a.RegisterFeed(ctx, outbox.FeedInfo{Name: "g", Kind: "kafka", Source: "orders"}))
	for _, p := range []int32{0, 1} {
		_, err := a.ClaimPartition(ctx, "g", p, "a")
		testutil.Must(t, err)
	}
	_, err := b.ClaimPartition(ctx, "g", 2, "b")
	testutil.Must(t, err)
	tx, err := a.Begin(ctx)
	testutil.Must(t, err)
	testutil.Must(t, tx.SetPosition(ctx, "g", outbox.Checkpoint{Partition: 0, Epoch: "id:0", Position: 10, End: 15}))
	testutil.Must(t, tx.Commit())
	_, err = b.ClaimPartition(ctx, "g", 1, "b") // moved from a to b
	testutil.Must(t, err)
	_, ok, err := b.AcquireLease(ctx, "relay", "b", 30e9)
	testutil.Must(t, err)
	if !ok {
		t.Fatal("b did not get the relay's lease")
	}

	srv, err := api.New(api.DefaultConfig(), a, nil, nil, quiet())
	testutil.Must(t, err)
	base := newTestServer(t, srv)
	var c api.Cluster
	getJSON(t, base+"/cluster", &c)
	got := fmt.Sprint(len(c.Servers), len(c.Unowned), len(c.Leases))
	if got != "2 0 1" {
		t.Fatalf("cluster %+v: want 2 servers, none unowned, 1 lease", c)
	}
	sa, sb := c.Servers[0], c.Servers[1]
	if sa.ID != "a" || sa.API != "http://a:8080" || !sa.Alive || len(sa.Partitions) != 1 || sa.Partitions[0].Partition != 0 ||
		sa.Partitions[0].Epoch != 1 || len(sa.Leases) != 0 {
		t.Errorf("server a %+v: want alive, holding g[0] at epoch 1, no lease", sa)
	}
	if sb.ID != "b" || len(sb.Partitions) != 2 || sb.Partitions[0].Partition != 1 || sb.Partitions[0].Epoch != 2 ||
		sb.Partitions[1].Partition != 2 || len(sb.Leases) != 1 || sb.Leases[0] != "relay" {
		t.Errorf("server b %+v: want g[1] at epoch 2, g[2], the relay's lease", sb)
	}
	if l := c.Leases[0]; l.Name != "relay" || l.Holder != "b" || l.Term != 1 || l.Expired {
		t.Errorf("lease %+v: want the relay's, held by b at term 1", l)
	}

	var fs api.FeedStatus
	getJSON(t, base+"/feeds/g/status", &fs)
	want := []api.PartitionStatus{
		{Partition: 0, Epoch: "id:0", Position: 10, End: 15, Lag: 5, Owner: "a", OwnerEpoch: 1},
		{Partition: 1, Owner: "b", OwnerEpoch: 2},
		{Partition: 2, Owner: "b", OwnerEpoch: 1},
	}
	if fmt.Sprint(fs.Partitions) != fmt.Sprint(want) {
		t.Fatalf("partitions %+v, want %+v", fs.Partitions, want)
	}

	testutil.Must(t, a.ReleasePartition(ctx, "g", 0))
	getJSON(t, base+"/cluster", &c)
	if len(c.Unowned) != 1 || c.Unowned[0].Partition != 0 || len(c.Servers[0].Partitions) != 0 {
		t.Fatalf("cluster %+v: want g[0] unowned once a released it", c)
	}
}
