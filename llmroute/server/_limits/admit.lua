-- KEYS: the key's slots (a sorted set), then per scope: requests hash, tokens hash, budget
--       counter, soft-limit flag, money budget counter.
-- ARGV: bucket, buckets summed, tokens, hashes' ttl, dry (1: count nothing), now, lease,
--       slot limit (0: no slot), slot token, scopes, money (nano-dollars); then per scope: rpm,
--       tpm, budget (0: none), budget's ttl, soft-limit tokens (0: none), money budget (0: none).
-- Returns {verdict, scope index (0-based, -1: none), then per scope: requests, oldest request
--          bucket (-1: none), tokens, oldest tokens bucket, spent, soft limit reached (1),
--          money spent}. A money budget admits a request only if its money fits in what is left.
-- Every argument is checked (whole numbers, tokens of at most 15 digits; now and lease
-- numbers) before anything is read or written: an error writes nothing. Every write happens
-- after every check, so a refused request has changed nothing.
local whole = {1, 2, 3, 4, 5, 8, 10, 11}
for _, i in ipairs(whole) do
  if not string.match(ARGV[i], '^%d+$') then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a whole number')
  end
end
for _, i in ipairs({6, 7}) do
  if not string.match(ARGV[i], '^%d+%.?%d*$') then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a number')
  end
end
if #ARGV[3] > 15 then return redis.error_reply('llmroute limits: tokens of more than 15 digits') end
if #ARGV[11] > 16 then return redis.error_reply('llmroute limits: money of more than 16 digits') end
if #ARGV ~= 11 + 6 * tonumber(ARGV[10]) or #KEYS ~= 1 + 5 * tonumber(ARGV[10]) then
  return redis.error_reply('llmroute limits: arguments do not match the scopes')
end
for i = 12, #ARGV do
  if not string.match(ARGV[i], '^%d+$') or #ARGV[i] > 16 then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a whole number')
  end
end
local bucket = tonumber(ARGV[1])
local span = tonumber(ARGV[2])
local tokens, ttl, dry = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1'
local now, lease, slots = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local n = tonumber(ARGV[10])
local money = tonumber(ARGV[11])
local function window(key)
  local used, oldest = 0, -1
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local b, c = tonumber(fields[i]), tonumber(fields[i + 1])
    if b <= bucket - span then
      redis.call('HDEL', key, fields[i])
    else
      used = used + c
      if c > 0 and (oldest < 0 or b < oldest) then oldest = b end
    end
  end
  return used, oldest
end
if slots > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= slots then return {5, -1} end
end
local rows = {}
for i = 0, n - 1 do
  local k, a = 2 + 5 * i, 12 + 6 * i
  local used, oldest = window(KEYS[k])
  local taken, taken_oldest = window(KEYS[k + 1])
  local spent, paid = 0, 0
  if tonumber(ARGV[a + 2]) > 0 then spent = tonumber(redis.call('GET', KEYS[k + 2]) or '0') end
  if tonumber(ARGV[a + 5]) > 0 then paid = tonumber(redis.call('GET', KEYS[k + 4]) or '0') end
  rows[i] = {used, oldest, taken, taken_oldest, spent, 0, paid}
end
local verdict, at = 0, -1
for i = 0, n - 1 do
  local tpm = tonumber(ARGV[13 + 6 * i])
  if tpm > 0 and tokens > tpm then verdict, at = 3, i break end
end
if verdict == 0 then
  for i = 0, n - 1 do
    local a, r = 12 + 6 * i, rows[i]
    local rpm, tpm, budget = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local purse = tonumber(ARGV[a + 5])
    if rpm > 0 and r[1] + 1 > rpm then verdict, at = 1, i break end
    if tpm > 0 and r[3] + tokens > tpm then verdict, at = 2, i break end
    if budget > 0 and r[5] >= budget then verdict, at = 4, i break end
    if purse > 0 and r[7] + money > purse then verdict, at = 6, i break end
  end
end
if verdict == 0 and not dry then
  if slots > 0 then
    redis.call('ZADD', KEYS[1], now + lease, ARGV[9])
    redis.call('EXPIRE', KEYS[1], math.ceil(lease) + 1)
  end
  for i = 0, n - 1 do
    local k, a, r = 2 + 5 * i, 12 + 6 * i, rows[i]
    redis.call('HINCRBY', KEYS[k], ARGV[1], 1)
    redis.call('EXPIRE', KEYS[k], ttl)
    r[1] = r[1] + 1
    if r[2] < 0 then r[2] = bucket end
    -- Written for 0 tokens too: it is where the answer's usage is corrected to.
    redis.call('HINCRBY', KEYS[k + 1], ARGV[1], ARGV[3])
    redis.call('EXPIRE', KEYS[k + 1], ttl)
    r[3] = r[3] + tokens
    if tokens > 0 and r[4] < 0 then r[4] = bucket end
    if tonumber(ARGV[a + 2]) > 0 then
      local budget_ttl, soft = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
      redis.call('INCRBY', KEYS[k + 2], ARGV[3])
      redis.call('EXPIRE', KEYS[k + 2], budget_ttl)
      r[5] = r[5] + tokens
      local flag = KEYS[k + 3]
      if soft > 0 and r[5] >= soft and redis.call('SET', flag, 1, 'EX', budget_ttl, 'NX') then
        r[6] = 1
      end
    end
    if tonumber(ARGV[a + 5]) > 0 then
      redis.call('INCRBY', KEYS[k + 4], ARGV[11])
      redis.call('EXPIRE', KEYS[k + 4], tonumber(ARGV[a + 3]))
      r[7] = r[7] + money
    end
  end
end
local out = {verdict, at}
for i = 0, n - 1 do
  for j = 1, 7 do out[#out + 1] = rows[i][j] end
end
return out
