// Package conformance runs Kubernetes' storage conformance suite
// (k8s.io/apiserver/pkg/storage/testing) against brain: the real etcd3 store
// of kube-apiserver v1.37.2, built over a clientv3 client to a brain server.
//
// Each test gets a brain of its own (python -m brain serve on a loopback port
// with a temp data dir), so tests that compact or count revisions see only
// their own history, as the upstream tests do with a fresh embedded etcd.
// With BRAIN_ENDPOINT set, every test runs against that server instead, each
// under its own key prefix (compaction is then shared between tests).
//
//	cd tests/k8s/conformance && go test -count=1 ./...
//
// Environment: BRAIN_PYTHON (default python3), BRAIN_REPO (default ../../..),
// BRAIN_ENDPOINT (use a running server).
package conformance

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
	"google.golang.org/grpc/grpclog"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/utils/clock"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

// The value prefix every stored object gets from the test transformer, so a
// test can tell transformed bytes from raw ones.
const valuePrefix = "test!"

// The etcd3 store never asks for pages larger than this (store.go maxLimit).
const storeMaxLimit = 10000

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
}

// ---------------------------------------------------------------------------
// brain processes
// ---------------------------------------------------------------------------

type brainOptions struct {
	progressNotifyInterval time.Duration
}

var prefixCounter atomic.Int64

// brainEndpoint returns a client endpoint and the key prefix the test should
// use under it.
func brainEndpoint(t testing.TB, opts brainOptions) (string, string) {
	if ep := os.Getenv("BRAIN_ENDPOINT"); ep != "" {
		if opts.progressNotifyInterval != 0 {
			t.Skip("needs a brain started with --watch-progress-notify-interval; unset BRAIN_ENDPOINT")
		}
		return ep, fmt.Sprintf("/conformance/%d-%d/", time.Now().UnixNano(), prefixCounter.Add(1))
	}
	repo := os.Getenv("BRAIN_REPO")
	if repo == "" {
		repo = "../../.."
	}
	repo, _ = filepath.Abs(repo)
	python := os.Getenv("BRAIN_PYTHON")
	if python == "" {
		python = "python3"
	}
	port := freePort(t)
	dir := t.TempDir()
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	args := []string{"-m", "brain", "serve", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", url, "--log-level", "warn"}
	if opts.progressNotifyInterval != 0 {
		args = append(args, "--watch-progress-notify-interval", opts.progressNotifyInterval.String())
	}
	logFile, err := os.Create(filepath.Join(dir, "brain.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, args...)
	cmd.Dir = repo
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group; and SIGTERM when the test binary dies without running
	// its cleanups (an interrupted go test), so no server is left behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting brain: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil && len(b) > 0 {
				t.Logf("brain log:\n%s", tail(string(b), 4000))
			}
		}
	})
	// Ready when a Range answers.
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(logFile.Name())
			t.Fatalf("brain exited during startup:\n%s", tail(string(b), 4000))
		default:
		}
		if rangeAnswers(url) {
			return url, ""
		}
		if time.Now().After(deadline) {
			t.Fatalf("brain not serving on %s after 30s", url)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func rangeAnswers(url string) bool {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return false
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = c.Get(ctx, "/registry/health")
	return err == nil
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// ---------------------------------------------------------------------------
// the store under test
// ---------------------------------------------------------------------------

// swapTransformer lets a test replace the transformer that the store and its
// watcher share (the suite's UpdatePrefixTransformer / UpdateTransformer
// hooks); upstream reaches into the store's unexported fields instead.
type swapTransformer struct {
	mu  sync.RWMutex
	cur value.Transformer
}

func (s *swapTransformer) get() value.Transformer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur
}

func (s *swapTransformer) set(t value.Transformer) {
	s.mu.Lock()
	s.cur = t
	s.mu.Unlock()
}

func (s *swapTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swapTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// failingCodec / failingTransformer fail on demand (the suite's setFailing hooks).
type failingCodec struct {
	runtime.Codec
	fail atomic.Bool
}

func (c *failingCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if c.fail.Load() {
		return nil, nil, fmt.Errorf("synthetic decode failure")
	}
	return c.Codec.Decode(data, defaults, into)
}

type failingTransformer struct {
	value.Transformer
	fail atomic.Bool
}

func (f *failingTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if f.fail.Load() {
		return nil, false, fmt.Errorf("synthetic transform failure")
	}
	return f.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

// storeUnderTest is the etcd3 store plus the hooks the suite asks for.
type storeUnderTest struct {
	storage.Interface
	client      *kubernetes.Client
	kv          *storagetesting.KVRecorder
	lists       *storagetesting.KubernetesRecorder
	transformer *swapTransformer
	prefixT     *storagetesting.PrefixTransformer
	codec       runtime.Codec
	keyPrefix   string
}

func (s *storeUnderTest) UpdatePrefixTransformer(modify storagetesting.PrefixTransformerModifier) func() {
	original := s.transformer.get()
	pt, ok := original.(*storagetesting.PrefixTransformer)
	if !ok {
		panic("UpdatePrefixTransformer on a store without a PrefixTransformer")
	}
	clone := *pt
	s.transformer.set(modify(&clone))
	return func() { s.transformer.set(original) }
}

func (s *storeUnderTest) UpdateTransformer(modify storagetesting.TransformerModifier) func() {
	original := s.transformer.get()
	s.transformer.set(modify(original))
	return func() { s.transformer.set(original) }
}

type setup struct {
	brain       brainOptions
	codec       runtime.Codec
	transformer value.Transformer
}

type option func(*setup)

func withProgressNotify(d time.Duration) option {
	return func(s *setup) { s.brain.progressNotifyInterval = d }
}
func withCodec(c runtime.Codec) option           { return func(s *setup) { s.codec = c } }
func withTransformer(t value.Transformer) option { return func(s *setup) { s.transformer = t } }

func newStore(t *testing.T, opts ...option) (context.Context, *storeUnderTest) {
	t.Helper()
	// The RequestWatchProgress / RangeStream support checks are process-wide.
	etcdfeature.DefaultFeatureSupportChecker = etcdfeature.NewDefaultFeatureSupportChecker()

	s := setup{codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
	prefixT := storagetesting.NewPrefixTransformer([]byte(valuePrefix), false)
	s.transformer = prefixT
	for _, o := range opts {
		o(&s)
	}
	endpoint, keyPrefix := brainEndpoint(t, s.brain)
	client, err := kubernetes.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	lists := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	kv := storagetesting.NewKVRecorder(client.KV, lists)
	client.KV = kv
	client.Kubernetes = lists
	t.Cleanup(func() { client.Close() })

	// The compactor gets a client of its own: its compact_rev_key reads (one
	// a second after start, under ListFromCacheSnapshot) would otherwise be
	// counted by the KV recorder that callsInvariants checks, and a test that
	// takes longer than a second to fill the store would see one Range too many.
	compactorClient, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint},
		DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { compactorClient.Close() })
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(compactorClient, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	leaseConfig := etcd3.NewDefaultLeaseManagerConfig()
	leaseConfig.ReuseDurationSeconds = 1 // the suite waits at most 30 s
	swap := &swapTransformer{cur: s.transformer}
	st, err := etcd3.New(client, compactor, s.codec, func() runtime.Object { return &example.Pod{} },
		func() runtime.Object { return &example.PodList{} }, keyPrefix, "/pods/",
		schema.GroupResource{Resource: "pods"}, swap, leaseConfig, etcd3.NewDefaultDecoder(s.codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if p, ok := s.transformer.(*storagetesting.PrefixTransformer); ok {
		prefixT = p
	} else {
		prefixT = nil
	}
	return context.Background(), &storeUnderTest{Interface: st, client: client, kv: kv, lists: lists,
		transformer: swap, prefixT: prefixT, codec: s.codec, keyPrefix: keyPrefix}
}

// key is the etcd key of a store key (the store prepends its path prefix).
func (s *storeUnderTest) key(k string) string {
	if s.keyPrefix == "" {
		return k
	}
	return strings.TrimSuffix(s.keyPrefix, "/") + k
}

// ---------------------------------------------------------------------------
// the hooks the suite takes
// ---------------------------------------------------------------------------

// storedObjectInvariants: the raw value under key is the transformer's prefix
// followed by an encoded object with no resourceVersion and no selfLink.
func (s *storeUnderTest) storedObjectInvariants() storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		resp, err := s.client.KV.Get(ctx, s.key(key))
		if err != nil {
			t.Fatalf("Get %s: %v", key, err)
		}
		if len(resp.Kvs) == 0 {
			t.Fatalf("nothing stored under %s", key)
		}
		raw := resp.Kvs[0].Value
		if !strings.HasPrefix(string(raw), valuePrefix) {
			t.Fatalf("stored value of %s lacks the transformer prefix: %q", key, raw)
		}
		obj, err := runtime.Decode(s.codec, raw[len(valuePrefix):])
		if err != nil {
			t.Fatalf("decoding %s: %v", key, err)
		}
		pod := obj.(*example.Pod)
		if pod.ResourceVersion != "" || pod.SelfLink != "" {
			t.Errorf("stored object has resourceVersion %q / selfLink %q; both must be empty", pod.ResourceVersion, pod.SelfLink)
		}
	}
}

// callsInvariants: the transformer decoded exactly the objects the list had to
// look at, and the store reached brain in as few Range calls as its page-size
// doubling allows (1 call without a limit).
func (s *storeUnderTest) callsInvariants() storagetesting.CallsValidation {
	return func(t *testing.T, pageSize, processed uint64) {
		if s.prefixT != nil {
			if reads := s.prefixT.GetReadsAndReset(); reads != processed {
				t.Errorf("transformer read %d objects, expected %d", reads, processed)
			}
		}
		want := uint64(1)
		if pageSize != 0 {
			limit, sum := pageSize, uint64(1)
			for sum < processed {
				limit = min(limit*2, storeMaxLimit)
				sum += limit
				want++
			}
		}
		if got := s.kv.GetReadsAndReset() + s.kv.GetStreamReadsAndReset(); got != want {
			t.Fatalf("%d Range calls to brain, expected %d", got, want)
		}
	}
}

// compaction runs the apiserver's own compaction transaction (the
// compact_rev_key CAS, then Compact) to the given resourceVersion and waits
// until the store has seen the new compacted revision.
func (s *storeUnderTest) compaction() storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		var version int64
		version, _, _, err = etcd3.Compact(ctx, s.client.Client, version, int64(rv))
		if err != nil { // the CAS lost: compact_rev_key had another version; retry with it
			_, _, _, err = etcd3.Compact(ctx, s.client.Client, version, int64(rv))
		}
		if err != nil {
			t.Fatalf("compacting to %d: %v", rv, err)
		}
		type compactRevisioner interface{ CompactRevision() int64 }
		cr, ok := s.Interface.(compactRevisioner)
		if !ok {
			return
		}
		deadline := time.Now().Add(10 * time.Second)
		for cr.CompactRevision() < int64(rv) {
			if time.Now().After(deadline) {
				t.Fatalf("store still reports compacted revision %d, want %d", cr.CompactRevision(), rv)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// increaseRV writes a key outside the store's prefix and returns the new revision.
func (s *storeUnderTest) increaseRV() storagetesting.IncreaseRVFunc {
	return func(ctx context.Context, t *testing.T) int64 {
		resp, err := s.client.KV.Put(ctx, s.key("/increaseRV"), "ok")
		if err != nil {
			t.Fatalf("Put increaseRV: %v", err)
		}
		return resp.Header.Revision
	}
}

// keys lists the store's keys (keys_only Range), for resource size estimation.
func (s *storeUnderTest) keys(ctx context.Context) ([]string, error) {
	resp, err := s.client.KV.Get(ctx, s.key("/pods/"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out, nil
}

func (s *storeUnderTest) enableSizeEstimation() error {
	e, ok := s.Interface.(interface {
		EnableResourceSizeEstimation(storage.KeysFunc) error
	})
	if !ok {
		return fmt.Errorf("the etcd3 store has no EnableResourceSizeEstimation")
	}
	return e.EnableResourceSizeEstimation(s.keys)
}
