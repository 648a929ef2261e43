package chorus

import (
	"context"
	"sync"

	"google.golang.org/grpc"

	"github.com/chorus-log/chorus/clients/go/chorusv1"
)

// NodeStatus is one endpoint's answer to Status.
type NodeStatus struct {
	// Endpoint as given to Dial.
	Endpoint string
	// Err is set when the endpoint did not answer (the fields below are then zero).
	Err error
	// Node is the node's id.
	Node uint64
	// ReplicationAddr is the node's replication address.
	ReplicationAddr string
	// Groups holds this node's replica of each group asked for.
	Groups []GroupStatus
	// DiskLow is true when the data directory's free space is below the node's
	// min_free_bytes: the groups it leads then refuse appends (ErrResourceExhausted).
	DiskLow bool
	// Raw is the full answer (every field of proto/chorus.proto's StatusResponse).
	Raw *chorusv1.StatusResponse
}

// GroupStatus is the state of one node's replica of a group (see GroupStatus in
// proto/chorus.proto for the fields not copied here; they are in Raw).
type GroupStatus struct {
	Group uint64
	Node  uint64
	// Role is "leader", "follower", "candidate" or "pending_follower".
	Role string
	// Leader is the leader's node id as this replica knows it, when HasLeader.
	Leader     uint64
	HasLeader  bool
	ProposalID uint64
	// StartLSN, EndLSN, FlushedLSN and CommittedLSN are this replica's log positions.
	StartLSN, EndLSN, FlushedLSN, CommittedLSN uint64
	Voters, Learners                           []uint64
	// Stopped says why the replica stopped ("" while it runs).
	Stopped string
	// Mode is "ordered", "parallel" or "dependent".
	Mode string
	// AccessMode is "append" or "raw-write" (ordered groups).
	AccessMode string
	Raw        *chorusv1.GroupStatus
}

// Status asks every endpoint, concurrently, for the state of its replica of the group
// (0: of every group), and returns one NodeStatus per endpoint, in endpoint order; an
// endpoint that does not answer has Err set. It never fails as a whole. The node ids it
// learns let leader-only calls follow a follower's leader hint straight to the leader.
func (c *Client) Status(ctx context.Context, group uint64) []NodeStatus {
	out := make([]NodeStatus, len(c.stubs))
	var wg sync.WaitGroup
	for i := range c.stubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].Endpoint = c.endpoints[i]
			var resp *chorusv1.StatusResponse
			a := c.invoke(ctx, i, func(ctx context.Context, stub chorusv1.ChorusClient, opts ...grpc.CallOption) error {
				r, err := stub.Status(ctx, &chorusv1.StatusRequest{Group: group}, opts...)
				resp = r
				return err
			})
			if a.err != nil {
				out[i].Err = a.statusError(c.endpoints[i])
				return
			}
			c.learnNode(resp.GetNode(), i)
			ns := &out[i]
			ns.Node, ns.ReplicationAddr, ns.DiskLow, ns.Raw = resp.GetNode(), resp.GetReplicationAddr(), resp.GetDiskLow(), resp
			for _, g := range resp.GetGroups() {
				ns.Groups = append(ns.Groups, GroupStatus{
					Group: g.GetGroup(), Node: g.GetNode(), Role: g.GetRole(),
					Leader: g.GetLeader(), HasLeader: g.GetHasLeader(), ProposalID: g.GetProposalId(),
					StartLSN: g.GetStartLsn(), EndLSN: g.GetEndLsn(), FlushedLSN: g.GetFlushedLsn(),
					CommittedLSN: g.GetCommittedLsn(), Voters: g.GetVoters(), Learners: g.GetLearners(),
					Stopped: g.GetStopped(), Mode: g.GetMode(), AccessMode: g.GetAccessMode(), Raw: g,
				})
			}
		}()
	}
	wg.Wait()
	return out
}

// Leader asks every endpoint for its status and returns the node that leads the group
// and its endpoint (of several replicas that say they lead, the one with the highest
// proposal id: a deposed leader may not know yet). It fails with ErrNoLeader when none
// does.
func (c *Client) Leader(ctx context.Context, group uint64) (node uint64, endpoint string, err error) {
	var best *GroupStatus
	bestIdx := -1
	var last string
	for i, ns := range c.Status(ctx, group) {
		if ns.Err != nil {
			last = ns.Err.Error()
			continue
		}
		for k := range ns.Groups {
			g := &ns.Groups[k]
			if g.Group == group && g.Role == "leader" && g.Stopped == "" && (best == nil || g.ProposalID > best.ProposalID) {
				best, bestIdx = g, i
			}
		}
	}
	if best == nil {
		return 0, "", &NoLeaderError{Group: group, Last: last}
	}
	c.setLeader(group, bestIdx)
	return best.Node, c.endpoints[bestIdx], nil
}
