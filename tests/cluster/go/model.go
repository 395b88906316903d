package main

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The sequential specification of an etcd keyspace restricted to a few keys,
// with the global revision: what porcupine checks a history against.
//
// The state is a value type (arrays, no maps or pointers) so it compares with
// == and copies for free; porcupine requires Step to be pure. It is not
// partitioned by key: one revision counter orders every key, and that
// ordering is most of what the check is about (a get that returns the right
// value at a stale revision is a violation).
//
// Two strengths:
//   - exclusive (the default): nothing but this run writes to the cluster,
//     so every write bumps the revision by exactly one and every read
//     returns the current revision.
//   - monotone: other writers may bump the revision; writes return a
//     revision above every revision seen before them, reads one at least
//     as high; per-key values and mod revisions are still exact.
//
// An operation whose outcome is unknown (timeout, lost connection) may or
// may not have taken effect, at any time after it was called: the history
// gives it an open-ended return time and the step offers both next states
// (a nondeterministic model; porcupine turns it into a deterministic one over
// sets of states).

// maxKeys bounds --keys so the state stays a small fixed-size value.
const maxKeys = 8

type opKind uint8

const (
	opGet opKind = iota
	opPut
	opCAS
	opDelete
)

func (k opKind) String() string {
	return [...]string{"get", "put", "cas", "delete"}[k]
}

// kvInput is one call. CAS compares the key's mod revision with ExpectMod
// (0: the key does not exist) or, when OnValue, its value with ExpectValue
// (a missing key never matches a value compare, as in etcd).
type kvInput struct {
	Op          opKind
	Key         int
	Value       string // put, cas: the value written
	OnValue     bool   // cas: compare the value instead of the mod revision
	ExpectMod   int64
	ExpectValue string
}

// kvOutput is one response. Rev is the response header's revision. A CAS
// whose compare failed carries the key as its else-branch Get returned it.
type kvOutput struct {
	Unknown   bool
	Rev       int64
	Succeeded bool  // cas
	Deleted   int64 // delete
	Exists    bool  // get, failed cas
	Value     string
	Mod       int64
}

// kvState: Mods[k] > 0 is the key's known mod revision, 0 means the key does
// not exist, and -m (monotone model only, after a write of unknown outcome
// took effect) means it exists with a mod revision of at least m, learned
// from the next read.
type kvState struct {
	Rev  int64
	Mods [maxKeys]int64
	Vals [maxKeys]string
}

func (s kvState) exists(k int) bool { return s.Mods[k] != 0 }

type kvModel struct {
	exclusive bool
	keys      int
	initRev   int64
}

// written is s after a write to key k at revision rev (rev <= 0: unknown,
// monotone model).
func written(s kvState, k int, v string, rev int64, exists bool) kvState {
	if exists {
		s.Vals[k] = v
		s.Mods[k] = rev
	} else {
		s.Vals[k] = ""
		s.Mods[k] = 0
	}
	return s
}

// writeRevOK says whether a write acknowledged at rev can follow state s.
func (m kvModel) writeRevOK(s kvState, rev int64) bool {
	if m.exclusive {
		return rev == s.Rev+1
	}
	return rev > s.Rev
}

// readOK says whether a read of key k at header revision rev returning
// (exists, value, mod) can happen in state s, and the state after it.
func (m kvModel) readOK(s kvState, k int, rev int64, exists bool, value string, mod int64) (bool, kvState) {
	if m.exclusive && rev != s.Rev || rev < s.Rev {
		return false, s
	}
	s.Rev = rev
	if exists != s.exists(k) {
		return false, s
	}
	if !exists {
		return true, s
	}
	if value != s.Vals[k] {
		return false, s
	}
	cur := s.Mods[k]
	if cur < 0 { // unknown mod revision of at least -cur: learn it
		if mod < -cur || mod > rev {
			return false, s
		}
		s.Mods[k] = mod
		return true, s
	}
	return mod == cur, s
}

// unknownApplied is s after a write of unknown outcome took effect: the
// revision is one more than s's (exclusive) or unknown above it (monotone).
func (m kvModel) unknownApplied(s kvState, k int, v string, exists bool) kvState {
	rev := s.Rev + 1
	mod := rev
	if !m.exclusive {
		mod = -rev
	}
	n := written(s, k, v, mod, exists)
	n.Rev = rev
	return n
}

// casHolds says whether in's compare holds in s: yes, no, or (a mod compare
// against an unknown mod revision) maybe.
func casHolds(s kvState, in kvInput) (holds, maybe bool) {
	k := in.Key
	if in.OnValue {
		return s.exists(k) && s.Vals[k] == in.ExpectValue, false
	}
	cur := s.Mods[k]
	if cur < 0 {
		return false, in.ExpectMod >= -cur
	}
	return cur == in.ExpectMod, false
}

func (m kvModel) step(state, input, output interface{}) []interface{} {
	s := state.(kvState)
	in := input.(kvInput)
	out := output.(kvOutput)
	k := in.Key
	if out.Unknown {
		switch in.Op {
		case opGet:
			return []interface{}{s}
		case opPut:
			return []interface{}{s, m.unknownApplied(s, k, in.Value, true)}
		case opDelete:
			if !s.exists(k) {
				return []interface{}{s}
			}
			return []interface{}{s, m.unknownApplied(s, k, "", false)}
		case opCAS:
			holds, maybe := casHolds(s, in)
			if !holds && !maybe {
				return []interface{}{s}
			}
			return []interface{}{s, m.unknownApplied(s, k, in.Value, true)}
		}
		return nil
	}
	switch in.Op {
	case opGet:
		if ok, n := m.readOK(s, k, out.Rev, out.Exists, out.Value, out.Mod); ok {
			return []interface{}{n}
		}
	case opPut:
		if m.writeRevOK(s, out.Rev) {
			n := written(s, k, in.Value, out.Rev, true)
			n.Rev = out.Rev
			return []interface{}{n}
		}
	case opDelete:
		if s.exists(k) {
			if out.Deleted == 1 && m.writeRevOK(s, out.Rev) {
				n := written(s, k, "", 0, false)
				n.Rev = out.Rev
				return []interface{}{n}
			}
		} else if out.Deleted == 0 {
			if m.exclusive && out.Rev == s.Rev || !m.exclusive && out.Rev >= s.Rev {
				n := s
				n.Rev = out.Rev
				return []interface{}{n}
			}
		}
	case opCAS:
		holds, maybe := casHolds(s, in)
		if out.Succeeded {
			if (holds || maybe) && m.writeRevOK(s, out.Rev) {
				n := written(s, k, in.Value, out.Rev, true)
				n.Rev = out.Rev
				return []interface{}{n}
			}
		} else if !holds {
			if ok, n := m.readOK(s, k, out.Rev, out.Exists, out.Value, out.Mod); ok {
				if maybe && n.Mods[k] == in.ExpectMod {
					return nil // the else branch saw the mod revision it compared against
				}
				return []interface{}{n}
			}
		}
	}
	return nil
}

func hashState(state interface{}) uint64 {
	s := state.(kvState)
	h := fnv.New64a()
	fmt.Fprint(h, s.Rev, s.Mods, s.Vals)
	return h.Sum64()
}

func describeInput(in kvInput) string {
	switch in.Op {
	case opGet:
		return fmt.Sprintf("get(k%d)", in.Key)
	case opPut:
		return fmt.Sprintf("put(k%d, %s)", in.Key, in.Value)
	case opDelete:
		return fmt.Sprintf("delete(k%d)", in.Key)
	case opCAS:
		if in.OnValue {
			return fmt.Sprintf("cas(k%d value==%q, %s)", in.Key, in.ExpectValue, in.Value)
		}
		return fmt.Sprintf("cas(k%d mod==%d, %s)", in.Key, in.ExpectMod, in.Value)
	}
	return "?"
}

func describeOutput(in kvInput, out kvOutput) string {
	if out.Unknown {
		return "unknown"
	}
	read := func() string {
		if !out.Exists {
			return fmt.Sprintf("absent @%d", out.Rev)
		}
		return fmt.Sprintf("%s mod %d @%d", out.Value, out.Mod, out.Rev)
	}
	switch in.Op {
	case opGet:
		return read()
	case opPut:
		return fmt.Sprintf("@%d", out.Rev)
	case opDelete:
		return fmt.Sprintf("deleted %d @%d", out.Deleted, out.Rev)
	case opCAS:
		if out.Succeeded {
			return fmt.Sprintf("ok @%d", out.Rev)
		}
		return "failed, " + read()
	}
	return "?"
}

func (m kvModel) porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{kvState{Rev: m.initRev}} },
		Step: m.step,
		Hash: hashState,
		DescribeOperation: func(input, output interface{}) string {
			in := input.(kvInput)
			return describeInput(in) + " -> " + describeOutput(in, output.(kvOutput))
		},
		DescribeState: func(state interface{}) string {
			s := state.(kvState)
			var b strings.Builder
			fmt.Fprintf(&b, "rev %d", s.Rev)
			for k := 0; k < m.keys; k++ {
				switch {
				case s.Mods[k] == 0:
					fmt.Fprintf(&b, " k%d:-", k)
				case s.Mods[k] < 0:
					fmt.Fprintf(&b, " k%d:%s@>=%d", k, s.Vals[k], -s.Mods[k])
				default:
					fmt.Fprintf(&b, " k%d:%s@%d", k, s.Vals[k], s.Mods[k])
				}
			}
			return b.String()
		},
	}
	return nm.ToModel()
}
