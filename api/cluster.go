package api

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// ServerAliveWithin is how recently a server sharing the database must
// have said it was alive (outbox.Store.SeenServer) for /cluster to call it
// alive.
const ServerAliveWithin = 5 * time.Second

// Cluster is the answer of GET /cluster: the servers sharing the database,
// the group feeds' partitions each holds, and the leases, all as the store
// has them. A database with one server of its own lists none.
type Cluster struct {
	Servers []ClusterServer `json:"servers"`
	// Unowned are the group feeds' partitions no server holds now.
	Unowned []ClusterPartition `json:"unowned"`
	Leases  []ClusterLease     `json:"leases"`
}

// ClusterServer is one server sharing the database.
type ClusterServer struct {
	ID        string    `json:"id"`
	API       string    `json:"api"`
	StartedAt time.Time `json:"startedAt"`
	SeenAt    time.Time `json:"seenAt"`
	// Alive: seen within ServerAliveWithin.
	Alive      bool               `json:"alive"`
	Partitions []ClusterPartition `json:"partitions"`
	// Leases are the names of the leases it holds unexpired.
	Leases []string `json:"leases"`
}

// ClusterPartition is a group feed's partition with its owner epoch.
type ClusterPartition struct {
	Feed      string    `json:"feed"`
	Partition int32     `json:"partition"`
	Epoch     int64     `json:"epoch"`
	ClaimedAt time.Time `json:"claimedAt"`
}

// ClusterLease is a lease (the relay's leader): its holder and term.
type ClusterLease struct {
	Name      string    `json:"name"`
	Holder    string    `json:"holder"`
	Term      int64     `json:"term"`
	ExpiresAt time.Time `json:"expiresAt"`
	Expired   bool      `json:"expired"`
}

func (s *Server) handleCluster(w http.ResponseWriter, r *http.Request) {
	c, err := s.cluster(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// cluster reads the servers, the partition owners and the leases.
func (s *Server) cluster(ctx context.Context) (Cluster, error) {
	servers, err := s.store.ClusterServers(ctx)
	if err != nil {
		return Cluster{}, err
	}
	owners, err := s.store.PartitionOwners(ctx, "")
	if err != nil {
		return Cluster{}, err
	}
	leases, err := s.store.Leases(ctx)
	if err != nil {
		return Cluster{}, err
	}
	now := s.store.Now()
	c := Cluster{Servers: make([]ClusterServer, 0, len(servers)), Unowned: []ClusterPartition{},
		Leases: make([]ClusterLease, 0, len(leases))}
	byID := map[string]*ClusterServer{}
	for _, sv := range servers {
		seen := time.Unix(0, sv.SeenAt).UTC()
		c.Servers = append(c.Servers, ClusterServer{ID: sv.ID, API: sv.API, StartedAt: time.Unix(0, sv.StartedAt).UTC(),
			SeenAt: seen, Alive: now.Sub(seen) <= ServerAliveWithin, Partitions: []ClusterPartition{}, Leases: []string{}})
	}
	for i := range c.Servers {
		byID[c.Servers[i].ID] = &c.Servers[i]
	}
	for _, o := range owners {
		p := ClusterPartition{Feed: o.Feed, Partition: o.Partition, Epoch: o.Epoch, ClaimedAt: time.Unix(0, o.ClaimedAt).UTC()}
		if sv, ok := byID[o.Owner]; ok {
			sv.Partitions = append(sv.Partitions, p)
		} else {
			c.Unowned = append(c.Unowned, p)
		}
	}
	for _, l := range leases {
		expired := now.UnixNano() >= l.ExpiresAt
		c.Leases = append(c.Leases, ClusterLease{Name: l.Name, Holder: l.Holder, Term: l.Term,
			ExpiresAt: time.Unix(0, l.ExpiresAt).UTC(), Expired: expired})
		if sv, ok := byID[l.Holder]; ok && !expired {
			sv.Leases = append(sv.Leases, l.Name)
		}
	}
	return c, nil
}

// setOwners gives each partition of a group feed its owner, from the store.
func (s *Server) setOwners(ctx context.Context, fs *FeedStatus) error {
	owners, err := s.store.PartitionOwners(ctx, fs.Feed)
	if err != nil || len(owners) == 0 {
		return err
	}
	byPart := make(map[int32]outbox.PartitionOwner, len(owners))
	for _, o := range owners {
		byPart[o.Partition] = o
	}
	for i := range fs.Partitions {
		if o, ok := byPart[fs.Partitions[i].Partition]; ok {
			fs.Partitions[i].Owner, fs.Partitions[i].OwnerEpoch = o.Owner, o.Epoch
			delete(byPart, o.Partition)
		}
	}
	for _, o := range byPart { // claimed, nothing committed yet
		fs.Partitions = append(fs.Partitions, PartitionStatus{Partition: o.Partition, Owner: o.Owner, OwnerEpoch: o.Epoch})
	}
	slices.SortFunc(fs.Partitions, func(a, b PartitionStatus) int { return cmp.Compare(a.Partition, b.Partition) })
	return nil
}
