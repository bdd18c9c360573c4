-- handback(run, ttl, grace, pttl, k1, tok1, p1, epoch1, ...): worker jobs
-- that a worker stopped because it lost the pool's state (its lease ran
-- out while Redis was away, or Redis came back without its records) go
-- back into the pool as orphans, placed by the next keeper once learning
-- mode ends, each under a new token above the old one (fenced as any
-- hand-over is). A job goes back only into a pool re-created since the
-- worker held it (its epoch differs from epoch_i): a pool that kept its
-- state still has the job's record (and orphans it when it reaps the
-- worker), and there a key without a record was stopped on purpose. A key
-- the pool holds already (dispatched again, re-asserted by adopt) is left
-- as it is: handing back twice, or after a re-dispatch, changes nothing.
-- -> {'OK', handed} | {'NOPOOL'} | {'SHUTDOWN'} | {'CLOSED'}
if redis.call('EXISTS', META) == 0 then return {shut_down() and 'CLOSED' or 'NOPOOL'} end
ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), '')
if mnum('shut') ~= 0 then return {'SHUTDOWN'} end
local pttl, epoch, n = tonumber(ARGV[4]), mget('epoch'), 0
for i = 5, #ARGV, 4 do
  local k, t, p, e = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if e ~= epoch and redis.call('HEXISTS', P .. 'jobs', k) == 0
      and not redis.call('HGET', P .. 'st', k) then
    redis.call('HSET', P .. 'jobs', k, p)
    -- the new token is above the one the stopped run held
    redis.call('HSET', META, 'ctr', fmt(math.max(mnum('ctr'), tonumber(t) or 0)))
    assign(k, '', pttl)
    n = n + 1
  end
end
return {'OK', n}
