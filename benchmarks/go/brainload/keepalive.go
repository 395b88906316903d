package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// keepalive: keep --leases leases of --ttl seconds alive through ONE
// LeaseKeepAlive stream on one connection, as fast as the server answers.
//
// The stream opens first; the leases are then granted (--clients over
// --conns, each with one key put WithLease) while the stream already keeps
// the granted ones alive at clientv3's pace (a keep-alive when a third of
// the TTL has passed), so a grant phase longer than the TTL expires
// nothing. Once every lease is granted the timed phase runs for --duration:
// keep-alives go round-robin over the leases, at most --window unanswered
// at a time and never two for one lease (clientv3 sends a keep-alive for
// every due lease of its stream at once without waiting for answers;
// --window bounds that burst). One op = one keep-alive answered in the timed
// phase; latency = its answer time minus its send time.
//
// Nothing may expire: an answer with TTL <= 0 means the server no longer
// knew the lease (etcd answers a keep-alive of an expired lease that way),
// the longest time any lease went without an answered keep-alive (from its
// grant, then between answers, then to the end of the run) is reported, and
// after the run a count of the keys must still be --leases.
//
// The stream is a plain gRPC stream (clientv3's lease wrapper paces
// keep-alives at TTL/3 per lease, so it could not measure a rate).
func runKeepAlive(args []string) (result, error) {
	c := newFlags("keepalive", 64, 10*time.Second)
	leases := c.fs.Int("leases", 10000, "leases to grant and keep alive, one key each")
	ttl := c.fs.Int64("ttl", 5, "lease TTL in seconds")
	window := c.fs.Int("window", 1000, "keep-alives in flight on the stream at most (capped at --leases)")
	drain := c.fs.Duration("drain", 10*time.Second, "after --duration, wait this long for the answers in flight")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *leases < 1 || *ttl < 1 || *window < 1 {
		return nil, fmt.Errorf("--leases, --ttl and --window must be >= 1")
	}
	*window = min(*window, *leases)
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	prefix := c.prefix + "keepalive/"
	val := randValue(c.valSize)
	r := result{"leases": *leases, "ttl_s": *ttl, "window": *window, "val_size": c.valSize,
		"grant_clients": c.clients, "grant_conns": c.conns, "streams": 1}
	el := &errLog{}

	// The stream: one connection of its own.
	conn, err := c.rawConn()
	if err != nil {
		return r, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := pb.NewLeaseClient(conn).LeaseKeepAlive(ctx)
	if err != nil {
		return r, fmt.Errorf("opening the LeaseKeepAlive stream: %w", err)
	}

	// Per lease i: its ID once granted (0 before), whether a keep-alive is
	// in flight, when that was sent, and when the lease was last known alive
	// (its grant, then each answer with TTL > 0; the receiver alone writes it
	// after the grant).
	ids := make([]atomic.Int64, *leases)
	inflight := make([]atomic.Bool, *leases)
	sent := make([]atomic.Int64, *leases)
	alive := make([]atomic.Int64, *leases)
	var indexMu sync.Mutex
	index := make(map[int64]int, *leases)
	var longestGapNs atomic.Int64

	tokens := make(chan struct{}, *window)
	for i := 0; i < *window; i++ {
		tokens <- struct{}{}
	}
	h := newHist()
	var timed atomic.Bool // set when the timed phase starts
	var answered, answeredBefore, expired, unknown atomic.Int64
	recvDone := make(chan error, 1)
	var stopping atomic.Bool
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				if stopping.Load() && (errors.Is(err, io.EOF) || ctx.Err() != nil) {
					err = nil
				}
				recvDone <- err
				return
			}
			now := time.Now().UnixNano()
			indexMu.Lock()
			i, known := index[resp.ID]
			indexMu.Unlock()
			if !known {
				unknown.Add(1)
				tokens <- struct{}{}
				continue
			}
			if resp.TTL <= 0 {
				expired.Add(1)
			} else {
				if gap := now - alive[i].Load(); gap > longestGapNs.Load() {
					longestGapNs.Store(gap)
				}
				alive[i].Store(now)
			}
			if timed.Load() {
				h.addUs(float64(now-sent[i].Load()) / 1e3)
				answered.Add(1)
			} else {
				answeredBefore.Add(1)
			}
			inflight[i].Store(false)
			tokens <- struct{}{}
		}
	}()

	// The sender: round-robin over the granted leases with nothing in flight.
	paceNs := *ttl * int64(time.Second) / 3
	var sentN, sentTimed atomic.Int64
	var sendErr error
	senderStop := make(chan struct{})
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		next := 0
		for {
			select {
			case <-tokens:
			case err := <-recvDone:
				recvDone <- err
				sendErr = fmt.Errorf("the stream ended early: %v", err)
				return
			case <-senderStop:
				return
			}
			// Before the timed phase a lease is only kept alive when a
			// third of its TTL has passed (clientv3's pace), so the grant
			// phase is not slowed by keep-alives of the first leases.
			due := time.Now().UnixNano() - paceNs
			isTimed := timed.Load()
			found := -1
			for k := 0; k < *leases; k++ {
				j := (next + k) % *leases
				if ids[j].Load() != 0 && !inflight[j].Load() && (isTimed || alive[j].Load() <= due) {
					found = j
					break
				}
			}
			if found < 0 { // nothing granted or due yet, or all in flight
				tokens <- struct{}{}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			next = (found + 1) % *leases
			inflight[found].Store(true)
			sent[found].Store(time.Now().UnixNano())
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: ids[found].Load()}); err != nil {
				sendErr = fmt.Errorf("send: %w", err)
				return
			}
			sentN.Add(1)
			if timed.Load() {
				sentTimed.Add(1)
			}
		}
	}()

	// Grant + Put WithLease while the stream keeps the granted leases alive.
	_, ok, secs := countLoop(c.clients, *leases, el, "keepalive grant+put", func(w, i int) error {
		cli := p.get(w)
		cctx, ccancel := c.ctx()
		defer ccancel()
		g, err := cli.Grant(cctx, *ttl)
		if err != nil {
			return fmt.Errorf("grant: %w", err)
		}
		alive[i].Store(time.Now().UnixNano())
		indexMu.Lock()
		index[int64(g.ID)] = i
		indexMu.Unlock()
		ids[i].Store(int64(g.ID))
		if _, err := cli.Put(cctx, keyName(prefix, i), val, clientv3.WithLease(g.ID)); err != nil {
			return fmt.Errorf("put with lease: %w", err)
		}
		return nil
	})
	r["grant_seconds"] = round3(secs)
	if int(ok) != *leases {
		close(senderStop)
		<-senderDone
		el.into(r)
		return r, fmt.Errorf("grant+put: %d of %d succeeded", ok, *leases)
	}
	fmt.Fprintf(os.Stderr, "keepalive: %d leases granted with a key each in %.2f s (%d keep-alives answered meanwhile)\n",
		*leases, secs, answeredBefore.Load())

	// The timed phase; the marks on stderr let a caller read the server's
	// CPU time at its edges.
	fmt.Fprintln(os.Stderr, "brainload-phase: timed begin")
	start := time.Now()
	timed.Store(true)
	stop := progress("keepalive", func() int64 { return answered.Load() })
	select {
	case <-time.After(c.duration):
	case <-senderDone:
	}
	close(senderStop)
	<-senderDone
	sendSecs := time.Since(start).Seconds()
	fmt.Fprintln(os.Stderr, "brainload-phase: timed end")
	// Drain: every keep-alive sent gets its answer (or the drain times out).
	drainUntil := time.Now().Add(*drain)
	settled := func() bool {
		return answered.Load()+answeredBefore.Load()+unknown.Load() >= sentN.Load()
	}
	for !settled() && time.Now().Before(drainUntil) && sendErr == nil {
		select {
		case err := <-recvDone:
			recvDone <- err
			sendErr = fmt.Errorf("the stream ended while draining: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	secs = time.Since(start).Seconds()
	stop()
	stopping.Store(true)
	_ = stream.CloseSend()
	cancel()
	select {
	case <-recvDone:
	case <-time.After(5 * time.Second):
	}

	end := time.Now().UnixNano()
	gap := longestGapNs.Load()
	for i := range alive {
		gap = max(gap, end-alive[i].Load())
	}
	n := answered.Load()
	r["keepalives_sent"] = sentTimed.Load()
	r["keepalives_during_grant"] = answeredBefore.Load()
	r["send_seconds"] = round3(sendSecs)
	r["expired_answers"] = expired.Load()
	r["unknown_answers"] = unknown.Load()
	r["longest_gap_s"] = round3(float64(gap) / 1e9)
	fill(r, 1, h, n, secs, el)
	r["keepalives_per_s"] = r["ops_per_s"]
	if sendErr != nil {
		return r, sendErr
	}
	if !settled() {
		return r, fmt.Errorf("%d keep-alives unanswered %v after the run",
			sentN.Load()-answered.Load()-answeredBefore.Load()-unknown.Load(), *drain)
	}

	// Nothing expired: every key is still there.
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	resp, err := p.get(0).Get(cctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	ccancel()
	if err != nil {
		return r, fmt.Errorf("counting the leased keys: %w", err)
	}
	r["keys_left"] = resp.Count
	lost := int64(*leases) - resp.Count
	r["expired"] = max(lost, expired.Load())
	fmt.Fprintf(os.Stderr, "keepalive: %d answered in %.2f s (%.0f/s), %d answers with TTL 0, %d of %d keys left, longest gap %.2f s\n",
		n, secs, float64(n)/secs, expired.Load(), resp.Count, *leases, float64(gap)/1e9)
	if lost > 0 || expired.Load() > 0 {
		return r, fmt.Errorf("leases expired while kept alive: %d answers with TTL 0, %d of %d keys gone",
			expired.Load(), lost, *leases)
	}
	return r, nil
}

// rawConn is one plain gRPC connection to the first endpoint (TLS when the
// flags ask for it), without clientv3's interceptors.
func (c *common) rawConn() (*grpc.ClientConn, error) {
	ep := c.endpointList()[0]
	for _, s := range []string{"http://", "https://"} {
		ep = strings.TrimPrefix(ep, s)
	}
	creds := insecure.NewCredentials()
	if c.tls != nil {
		creds = credentials.NewTLS(c.tls)
	}
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", ep, err)
	}
	return conn, nil
}
