"""etcd's request timeout: the one home of how long a write, a forwarded
call or a lease revoke waits for an answer it may never get.

etcd computes it as 5 s plus twice the election timeout (1 s by default):
7 s.  Past it the caller hears ``etcdserver: request timed out`` and does
not know the outcome.  brain uses it wherever etcd does: a write waiting
for an unreachable shared journal, a follower's forwarded write or lease
call waiting for the leader's answer and for its own apply, and an expired
lease whose revoke did not complete (etcd's lessor retries it after this).
"""

REQUEST_TIMEOUT = 7.0
