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
