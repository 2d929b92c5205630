// The official openai npm client against llmsd's HTTP gateway (run by test_http_clients).
// Environment: LLMSD_URL (http://127.0.0.1:PORT/v1), LLMSD_TOKEN, LLMSD_MODEL.
// Prints "ok NAME" per check and "FAIL NAME: why" on the first failure (exit 1).
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: process.env.LLMSD_URL,
  apiKey: process.env.LLMSD_TOKEN,
  maxRetries: 0,
  timeout: 60000,
});
const model = process.env.LLMSD_MODEL;

function check(name, cond, why) {
  if (!cond) {
    console.log(`FAIL ${name}: ${why}`);
    process.exit(1);
  }
  console.log(`ok ${name}`);
}

const models = await client.models.list();
check('models', models.data.length >= 1 && models.data[0].id === model, JSON.stringify(models.data));

const one = await client.models.retrieve(model);
check('models retrieve', one.id === model && one.object === 'model', JSON.stringify(one));

const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'hello' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
const text = chat.choices[0].message.content;
check('chat', typeof text === 'string' && chat.usage.completion_tokens > 0 &&
      ['stop', 'length'].includes(chat.choices[0].finish_reason), JSON.stringify(chat));

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 12, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
let streamed = '';
let usage = null;
for await (const chunk of stream) {
  streamed += chunk.choices[0]?.delta?.content ?? '';
  if (chunk.usage) usage = chunk.usage;
}
check('chat stream', streamed === text && usage && usage.completion_tokens === chat.usage.completion_tokens,
      `${JSON.stringify(streamed)} vs ${JSON.stringify(text)}`);

// The Responses API: the same conversation as the chat above, as instructions and input.
const resp = await client.responses.create({
  model, instructions: 'Be brief.', input: 'hello', max_output_tokens: 12, temperature: 0,
});
check('responses', resp.object === 'response' && resp.id.startsWith('resp_') &&
      resp.output_text === text && resp.output[0].type === 'message' &&
      resp.usage.output_tokens === chat.usage.completion_tokens &&
      resp.usage.input_tokens === chat.usage.prompt_tokens &&
      resp.status === (chat.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed'),
      JSON.stringify(resp));

// Streamed: the SDK's own events, then its helper that assembles the final response.
const events = await client.responses.create({
  model, instructions: 'Be brief.', input: 'hello', max_output_tokens: 12, temperature: 0,
  stream: true,
});
let deltas = '';
let last = null;
let seq = -1;
let ordered = true;
for await (const event of events) {
  ordered &&= event.sequence_number === seq + 1;
  seq = event.sequence_number;
  if (event.type === 'response.output_text.delta') deltas += event.delta;
  last = event;
}
check('responses stream', ordered && deltas === text && last &&
      ['response.completed', 'response.incomplete'].includes(last.type) &&
      last.response.output[0].content[0].text === text,
      `${JSON.stringify(deltas)} vs ${JSON.stringify(text)}, last ${last && last.type}`);
const helper = client.responses.stream({
  model, instructions: 'Be brief.', input: 'hello', max_output_tokens: 12, temperature: 0,
});
let helped = '';
helper.on('response.output_text.delta', (e) => { helped += e.delta; });
const final = await helper.finalResponse();
// (this SDK's helper leaves output_text out of its final response: the item holds the text)
const finalText = final.output[0].content[0].text;
check('responses stream helper', helped === text && finalText === text && final.id.startsWith('resp_'),
      `${JSON.stringify(helped)} ${JSON.stringify(finalText)} vs ${JSON.stringify(text)}`);

// Stored responses: the next turn continues the first by previous_response_id (its
// conversation and the new input), retrieve gives the first back, its input items list
// the conversation newest first, and once deleted it is gone for both.
const next = await client.responses.create({
  model, instructions: 'Be brief.', input: 'and then?', previous_response_id: resp.id,
  max_output_tokens: 12, temperature: 0,
});
check('responses previous_response_id', next.previous_response_id === resp.id && next.store === true &&
      next.usage.input_tokens > resp.usage.input_tokens, JSON.stringify(next));
const got = await client.responses.retrieve(resp.id);
check('responses retrieve', got.id === resp.id && got.output[0].content[0].text === text,
      JSON.stringify(got));
const items = await client.responses.inputItems.list(next.id);
check('responses input_items', items.data.length === 3 && items.data[0].content[0].text === 'and then?' &&
      items.data[1].id === resp.output[0].id && items.data.every((item) => item.id),
      JSON.stringify(items.data));
const deleteResponse = client.responses.delete ?? client.responses.del;
await deleteResponse.call(client.responses, resp.id);
try {
  await client.responses.retrieve(resp.id);
  check('responses delete', false, 'retrieved after delete');
} catch (e) {
  check('responses delete', e instanceof OpenAI.NotFoundError && e.status === 404, `${e.status} ${e.message}`);
}
try {
  await client.responses.create({ model, input: 'hello', previous_response_id: resp.id });
  check('responses previous_response_id deleted', false, 'no error');
} catch (e) {
  check('responses previous_response_id deleted', e instanceof OpenAI.NotFoundError && e.status === 404 &&
        e.message.includes(resp.id), `${e.status} ${e.message}`);
}

const comp = await client.completions.create({ model, prompt: 'one two', max_tokens: 5, temperature: 0 });
check('completions', typeof comp.choices[0].text === 'string' && comp.usage.completion_tokens > 0,
      JSON.stringify(comp));

// The client asks for base64 by default and decodes it into floats.
const emb = await client.embeddings.create({ model, input: ['first', 'second'] });
const v = emb.data[0].embedding;
const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
check('embeddings', emb.data.length === 2 && v.length > 0 && Math.abs(norm - 1) < 1e-3,
      `${emb.data.length} vectors, norm ${norm}`);
const embf = await client.embeddings.create({ model, input: 'first', encoding_format: 'float' });
check('embeddings float', embf.data[0].embedding.every((x, i) => Math.abs(x - v[i]) < 1e-6),
      'float and base64 vectors differ');

try {
  await client.chat.completions.create({ model: 'no-such-model', messages, max_tokens: 2 });
  check('unknown model', false, 'no error');
} catch (e) {
  check('unknown model', e instanceof OpenAI.APIError && e.status === 404 && e.code === 'model_not_found',
        `${e.status} ${e.code} ${e.message}`);
}

const bad = new OpenAI({ baseURL: process.env.LLMSD_URL, apiKey: 'wrong', maxRetries: 0 });
try {
  await bad.models.list();
  check('bad token', false, 'no error');
} catch (e) {
  check('bad token', e instanceof OpenAI.AuthenticationError && e.status === 401, `${e.status} ${e.message}`);
}
