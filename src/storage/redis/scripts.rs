//! The Lua scripts: one per algorithm (`lua/*.lua`, each named by its
//! algorithm's [`Spec::lua`](crate::limit::algorithms::Spec)), and the batch script
//! built from them, which decides calls on several limiters of one server
//! in one `EVALSHA`. Each algorithm's text is written once; the batch
//! script runs it unchanged as a function of its own `KEYS` and `ARGV`.

use super::*;

/// How every algorithm script reads the server's clock: the batch script
/// reads it once instead.
pub(super) const READ_CLOCK: &str =
    "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000000 + tonumber(t[2])";

/// The scripts, by algorithm (in [`Algorithm::ALL`]'s order), and the
/// batch script.
pub(super) struct Scripts {
    by_algorithm: Vec<Script>,
    pub(super) batch: Script,
    pub(super) lease: Script,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            by_algorithm: Algorithm::ALL
                .iter()
                .map(|a| Script::from_lua(a.spec().lua))
                .collect(),
            batch: Script::from_lua(batch_lua()),
            lease: Script::from_lua(super::lease::lease_lua()),
        }
    }

    pub(super) fn of(&self, algorithm: Algorithm) -> &Script {
        let at = Algorithm::ALL.iter().position(|a| *a == algorithm);
        &self.by_algorithm[at.expect("every algorithm is in ALL")]
    }

    /// Every script, as a server loads them.
    pub(super) fn all(&self) -> impl Iterator<Item = &Script> {
        self.by_algorithm.iter().chain([&self.batch, &self.lease])
    }
}

/// A batch reply's marker for a call whose keys are not on that server.
pub(super) const NOT_HERE: i64 = -1;
/// A batch reply's marker for a call that failed otherwise.
pub(super) const FAILED: i64 = -2;

/// The batch script's number for the limits of a `rate_limits:` list
/// decided together (see [`batch_lua`]).
pub(super) const GROUP: i64 = 5;

/// The batch script's number for an algorithm.
pub(super) fn batch_id(algorithm: Algorithm) -> i64 {
    algorithm.spec().batch_id
}

/// The group function ([`GROUP`]): the limits of one descriptor's
/// `rate_limits:` list, in one step. Its `ARGV`: the number of limits `m`,
/// the number of costs `c`, then per limit its algorithm's number, key
/// count and argument count, then each limit's arguments as its own
/// script takes them (with `ARGV[6]` 2, receipts, or 1, usage reports),
/// then `c - 1` further (hits, negative) pairs. Its keys are the limits'
/// keys in order. Per cost, every limit decides it as its own script
/// would; unless they record usage reports, when one refuses, what the
/// others recorded is taken back (each script's undo mode, with the
/// receipt it just gave, after the call's own arguments, at the same
/// instant). The reply is each limit's
/// reply, per cost. A limit whose keys are not (all) on this server fails
/// at its first read: what the limits before it recorded is taken back
/// (with usage reports, which keep no receipts, every key is read before
/// the first limit runs), and the call fails whole, having recorded
/// nothing, as one script does.
const GROUP_LUA: &str = r#"
run[5] = function(KEYS, ARGV)
  local m, c = ARGV[1] + 0, ARGV[2] + 0
  local spec, keys, args = {}, {}, {}
  local p = 3
  for i = 1, m do
    spec[i] = {ARGV[p] + 0, ARGV[p + 1] + 0, ARGV[p + 2] + 0}
    p = p + 3
  end
  local k = 1
  for i = 1, m do
    local ks, as = {}, {}
    for j = 1, spec[i][2] do ks[j] = KEYS[k]; k = k + 1 end
    for j = 1, spec[i][3] do as[j] = ARGV[p]; p = p + 1 end
    keys[i], args[i] = ks, as
  end
  local rollback = args[1][6] == '2'
  if m > 1 and not rollback then
    -- Usage reports keep no receipts: every key is read before the first
    -- limit records, so a limit whose keys are elsewhere stops the call
    -- before anything is written.
    local rest = {}
    for j = spec[1][2] + 1, #KEYS do rest[#rest + 1] = KEYS[j] end
    redis.call('EXISTS', unpack(rest))
  end
  -- Takes back what limit i recorded (its reply r holds the receipt): its
  -- own arguments (a calendar window's boundaries included), then where
  -- the receipt says it recorded.
  local function undo(i, r)
    if r[4] > 0 then
      local a, u = args[i], {}
      for j = 1, #a do u[j] = a[j] end
      u[3], u[4], u[6] = string.format('%d', r[4]), '2', '0'
      u[#a + 1], u[#a + 2] = string.format('%d', r[5]), string.format('%d', r[6])
      run[spec[i][1]](keys[i], u)
    end
  end
  local out = {}
  for h = 1, c do
    if h > 1 then
      for i = 1, m do args[i][3] = ARGV[p]; args[i][4] = ARGV[p + 1] end
      p = p + 2
    end
    local replies, all = {}, true
    for i = 1, m do
      local ok, r = pcall(run[spec[i][1]], keys[i], args[i])
      if not ok then
        -- Its keys are not (all) here, or it failed: what the limits
        -- before it recorded is taken back, and the call fails whole.
        if rollback then
          for j = 1, i - 1 do undo(j, replies[j]) end
        end
        error(r, 0)
      end
      replies[i] = r
      if r[1] == 0 then all = false end
    end
    if rollback and not all then
      for i = 1, m do undo(i, replies[i]) end
    end
    for i = 1, m do
      local r = replies[i]
      for j = 1, #r do out[#out + 1] = r[j] end
    end
  end
  return out
end
"#;

/// The batch script. `ARGV` holds, per call in order: the algorithm's
/// number, its key count, its argument count, its keys, then its
/// arguments. The reply is, per call, the length of its reply followed by
/// that reply, or a lone `-1` ([`NOT_HERE`]: its keys are not on this
/// server) or `-2` ([`FAILED`]: another error). The calls run one after
/// the other in one atomic step, each exactly as its own script would,
/// each under its own `pcall`: one call's error is that call's alone.
///
/// The keys travel in `ARGV`, not `KEYS`: on a cluster a batch carries
/// limiters of many slots of one primary, and Redis refuses declared keys
/// of different slots in one call (`CROSSSLOT`) but lets a script without
/// flags use keys of any slot its server holds. So the batch goes to the
/// primary the routing names, as every call does, and Redis cannot
/// redirect it before it runs. A call whose slot moved away, or is being
/// migrated and its keys are not (all) here, fails at its first read
/// ("non local key"), before it writes anything (every algorithm's script
/// reads all its keys first): it answers `-1`, records nothing, and is
/// sent again alone, with its keys declared, so that Redis redirects it
/// (`MOVED`, `ASK`) to the node that holds them.
///
/// The server's clock is read once per batch, not once per call: every
/// call of a batch is decided at the same instant, as if they had arrived
/// together (one `redis.call` less per call; the batch is one atomic step
/// either way).
fn batch_lua() -> String {
    let mut text = String::from(
        "local clock = redis.call('TIME')\nclock = clock[1] * 1000000 + clock[2]\nlocal run = {}\n",
    );
    for spec in Algorithm::ALL.map(Algorithm::spec) {
        let (id, body) = (spec.batch_id, spec.lua);
        let body = body.replacen(READ_CLOCK, "local now = clock", 1);
        text.push_str(&format!("run[{id}] = function(KEYS, ARGV)\n{body}\nend\n"));
    }
    text.push_str(GROUP_LUA);
    text.push_str(
        r#"
local out = {}
local a = 1
while ARGV[a] do
  -- `s + 0` converts a string once, tonumber(s) twice (Lua 5.1).
  local algorithm = ARGV[a] + 0
  local nkeys = ARGV[a + 1] + 0
  local nargs = ARGV[a + 2] + 0
  local keys, args = {}, {}
  for j = 1, nkeys do keys[j] = ARGV[a + 2 + j] end
  for j = 1, nargs do args[j] = ARGV[a + 2 + nkeys + j] end
  a = a + 3 + nkeys + nargs
  local ok, reply = pcall(run[algorithm], keys, args)
  if ok then
    out[#out + 1] = #reply
    for j = 1, #reply do out[#out + 1] = reply[j] end
  else
    -- Each script reads all its keys before it writes any, so a call
    -- whose slot is not (or no longer wholly) here stops at its first
    -- read and records nothing: -1 says so, and only that call is sent
    -- again, to the node that holds its keys. -2: any other error, this
    -- call's alone.
    local message = type(reply) == 'table' and reply.err or tostring(reply)
    if string.find(message, 'non local key', 1, true)
      or string.find(message, 'READONLY', 1, true)
      or string.find(message, 'cluster is down', 1, true)
      or string.find(message, 'CLUSTERDOWN', 1, true) then
      out[#out + 1] = -1
    else
      out[#out + 1] = -2
    end
  end
end
return out
"#,
    );
    text
}

/// Whether a call reserves hits ahead ([`Hit::ahead`]): a fixed window's
/// or a sliding counter's lease with a receipt, alone, on a window of
/// fixed length.
pub(super) fn ahead(hit: &Hit<'_>, calendar: bool, more: &[Cost]) -> bool {
    matches!(
        hit.algorithm.spec().leasing,
        Leasing::Window | Leasing::Bucket
    ) && hit.receipt
        && !hit.ahead.is_none()
        && !calendar
        && more.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_reads_the_clock_once_and_the_batch_reads_it_once() {
        for body in Algorithm::ALL.map(|a| a.spec().lua) {
            assert_eq!(body.matches(READ_CLOCK).count(), 1);
            assert_eq!(body.matches("'TIME'").count(), 1);
            // `t` is the clock's reply: the batch removes its only use.
            let uses = body
                .match_indices("t[")
                .filter(|(at, _)| !body[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
                .count();
            assert_eq!(uses, 2, "the clock is read only there");
        }
        let batch = batch_lua();
        assert_eq!(batch.matches("'TIME'").count(), 1);
        assert_eq!(
            batch.matches("local now = clock").count(),
            Algorithm::ALL.len()
        );
    }
}
