// The official openai npm client reading a reasoning model's answers from llmsd's gateway
// (run by test_http_reasoning, whose model always writes "<think>\nsome thought\n</think>
// \n\nthe answer"). Environment: LLMSD_URL (http://127.0.0.1:PORT/v1), LLMSD_TOKEN,
// LLMSD_MODEL. Prints "ok NAME" per check and "FAIL NAME: why" on the first failure
// (exit 1).
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

const messages = [{ role: 'user', content: 'What is 2 + 2?' }];
const chat = await client.chat.completions.create({ model, messages });
const msg = chat.choices[0].message;
check('chat', msg.reasoning_content === 'some thought' && msg.content === 'the answer',
      JSON.stringify(chat));

const stream = await client.chat.completions.create({ model, messages, stream: true });
let reasoning = '', content = '';
for await (const chunk of stream) {
  reasoning += chunk.choices[0]?.delta?.reasoning_content ?? '';
  content += chunk.choices[0]?.delta?.content ?? '';
}
check('chat stream', reasoning === 'some thought' && content === 'the answer',
      `${JSON.stringify(reasoning)} ${JSON.stringify(content)}`);

const resp = await client.responses.create({ model, input: 'What is 2 + 2?' });
check('responses', resp.output[0].type === 'reasoning' &&
      resp.output[0].content[0].text === 'some thought' && resp.output_text === 'the answer',
      JSON.stringify(resp));

// The SDK's stream helper builds the response from the events: the reasoning item must sit
// at the output_index its events name, before the message.
const rs = client.responses.stream({ model, input: 'What is 2 + 2?' });
let deltas = '', done = null;
rs.on('response.reasoning.delta', (e) => { deltas += e.delta; });
rs.on('response.reasoning.done', (e) => { done = e.text; });
const final = await rs.finalResponse();
check('responses stream', deltas === 'some thought' && done === 'some thought' &&
      final.output[0].type === 'reasoning' && final.output[1].content[0].text === 'the answer',
      `${JSON.stringify(deltas)} ${JSON.stringify(done)} ${JSON.stringify(final)}`);
