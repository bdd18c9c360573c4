-- leave(run, wid, phase): phase 1 frees the worker's slot (its jobs then
-- route elsewhere; it moves them itself); phase 2 removes it for good
-- (whatever its records still name becomes an orphan).
-- -> {'OK', ver}
if redis.call('EXISTS', META) == 0 then return {'OK', 0} end
local w = ARGV[2]
if ARGV[3] == '1' then
  local idx = redis.call('LPOS', P .. 'slots', w)
  if idx then
    redis.call('LSET', P .. 'slots', idx, '')
    bump_members()
  end
else
  remove_worker(w)
end
return {'OK', mnum('ver')}
