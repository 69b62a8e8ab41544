#!/bin/bash
echo done > /app/answer.txt
